package analytics

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Sink receives what the Recorder flushes: the rollups changed since the
// last flush (rows to add to the ones already written) and the blocked
// events. A Sink is called from one goroutine at a time; an error means
// nothing of the call was kept, and the Recorder offers the same rows
// again with the next flush.
type Sink interface {
	Write(ctx context.Context, rollups []Rollup, blocked []Event) error
}

// ListSink is a Sink that also keeps the changes and the anomalies one by
// one. The Recorder calls WriteLists after Write, from the same goroutine,
// with the same contract: an error means nothing was kept, and the rows
// are offered again.
type ListSink interface {
	Sink
	WriteLists(ctx context.Context, changes []Change, anomalies []Anomaly) error
}

// Config shapes a Recorder. The zero value records into a 24-hour Memory
// store, with no sink.
type Config struct {
	// QueueSize bounds the events waiting to be aggregated; zero means
	// 65536. When the queue is full, Record drops the oldest event.
	QueueSize int
	// FlushInterval is how often rollups go to the Sink; zero means 10s.
	FlushInterval time.Duration
	// Memory receives the rollups as they are aggregated; nil means a new
	// Memory store with its defaults.
	Memory *Memory
	// Sink, when set, receives the rollups and blocked events every
	// FlushInterval.
	Sink Sink
	// MaxBacklog bounds the rollups and blocked events kept for the Sink
	// while it fails, and the blocked events waiting between two flushes;
	// zero means 100,000 of each. Beyond it, rows are dropped and counted
	// as the sink's gap.
	MaxBacklog int
	// Now returns the current time; nil means time.Now. It decides which
	// minutes the Memory store expires, and which minutes the anomaly
	// detector closes.
	Now func() time.Time
	// Detector shapes the anomaly detector (see DetectorConfig).
	Detector DetectorConfig
}

// changeQueue bounds the changes waiting for the aggregator.
const changeQueue = 1024

// Stats are a Recorder's counters since it started.
type Stats struct {
	// Recorded is the events aggregated.
	Recorded int64
	// Dropped is the events Record dropped because the queue was full.
	Dropped int64
	// SinkFlushes and SinkErrors count the Sink's writes and failures.
	SinkFlushes, SinkErrors int64
	// SinkBacklogRows is the rollups waiting for the Sink now.
	SinkBacklogRows int64
	// SinkDroppedRows and SinkDroppedEvents are the rollups, and the
	// blocked events, changes and anomalies, that never reached the Sink
	// because its backlog was full: the gap in the sink's history.
	SinkDroppedRows, SinkDroppedEvents int64
	// SinkFailing reports that the Sink's last write failed: the rows
	// since are waiting in the backlog.
	SinkFailing bool
	// ChangesDropped is the changes RecordChange dropped because their
	// queue was full.
	ChangesDropped int64
	// Anomalies is the anomalies detected; AnomalyRowsUntracked the
	// rollups the detector left out because it tracked MaxKeys keys.
	Anomalies, AnomalyRowsUntracked int64
}

// Recorder aggregates events into per-minute rollups in the background.
// Record is safe for concurrent use; Close stops the goroutines.
type Recorder struct {
	cfg     Config
	queue   chan Event
	changes chan Change
	memory  *Memory
	// detector is owned by the aggregator; nil when turned off.
	detector *detector

	recorded, dropped                  atomic.Int64
	flushes, sinkErrors, backlog       atomic.Int64
	sinkDroppedRows, sinkDroppedEvents atomic.Int64
	sinkFailing                        atomic.Bool
	changesDropped, anomalies          atomic.Int64
	untracked                          atomic.Int64

	// pending is what the aggregator gathered since the flusher last
	// took it.
	mu             sync.Mutex
	pending        map[Key]*Rollup // guarded by mu
	pendingBlocked []Event         // guarded by mu
	pendingLists   lists           // guarded by mu

	flushNow chan chan struct{} // Flush to the aggregator
	sinkNow  chan chan struct{} // the aggregator to the flusher
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// NewRecorder starts a Recorder's aggregator and, with a Sink, its flusher.
func NewRecorder(cfg Config) *Recorder {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 65536
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 10 * time.Second
	}
	if cfg.Memory == nil {
		cfg.Memory = NewMemory(MemoryConfig{})
	}
	if cfg.MaxBacklog <= 0 {
		cfg.MaxBacklog = 100_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Recorder{
		cfg:      cfg,
		queue:    make(chan Event, cfg.QueueSize),
		changes:  make(chan Change, changeQueue),
		memory:   cfg.Memory,
		detector: newDetector(cfg.Detector),
		pending:  map[Key]*Rollup{},
		flushNow: make(chan chan struct{}),
		sinkNow:  make(chan chan struct{}),
		cancel:   cancel,
	}
	aggregated := make(chan struct{})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(aggregated)
		r.aggregate(ctx)
	}()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.flushLoop(ctx, aggregated)
	}()
	return r
}

// Record queues ev for aggregation. It never blocks: when the queue is
// full the oldest event queued is dropped to make room, and counted in
// Stats.Dropped (ev itself, when other callers took the room first).
func (r *Recorder) Record(ev Event) {
	select {
	case r.queue <- ev:
		return
	default:
	}
	select {
	case <-r.queue:
		r.dropped.Add(1)
	default:
	}
	select {
	case r.queue <- ev:
	default:
		r.dropped.Add(1)
	}
}

// RecordChange queues c, to be kept in the Memory store and written to a
// ListSink. Like Record it never blocks: when the queue (1024 changes) is
// full the oldest is dropped and counted in Stats.ChangesDropped.
func (r *Recorder) RecordChange(c Change) {
	select {
	case r.changes <- c:
		return
	default:
	}
	select {
	case <-r.changes:
		r.changesDropped.Add(1)
	default:
	}
	select {
	case r.changes <- c:
	default:
		r.changesDropped.Add(1)
	}
}

// Memory returns the in-process store the Recorder fills.
func (r *Recorder) Memory() *Memory { return r.memory }

// Stats returns the Recorder's counters.
func (r *Recorder) Stats() Stats {
	return Stats{
		Recorded:          r.recorded.Load(),
		Dropped:           r.dropped.Load(),
		SinkFlushes:       r.flushes.Load(),
		SinkErrors:        r.sinkErrors.Load(),
		SinkBacklogRows:   r.backlog.Load(),
		SinkDroppedRows:   r.sinkDroppedRows.Load(),
		SinkDroppedEvents: r.sinkDroppedEvents.Load(),
		SinkFailing:       r.sinkFailing.Load(),

		ChangesDropped:       r.changesDropped.Load(),
		Anomalies:            r.anomalies.Load(),
		AnomalyRowsUntracked: r.untracked.Load(),
	}
}

// Flush waits until every event queued before the call is in the Memory
// store and, with a Sink, has been offered to it once. It returns early
// when ctx ends.
func (r *Recorder) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case r.flushNow <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the Recorder: the events still queued are aggregated and
// offered to the Sink once more, then the goroutines end. With a Sink
// that does not answer, Close waits for that last write's timeout (30s).
func (r *Recorder) Close() {
	r.cancel()
	r.wg.Wait()
}

// batchSize bounds the rollups, and the blocked events, the aggregator
// folds before it publishes them to the Memory store and the pending rows.
// A batch holds a second of events (publishEvery): the keys of a second
// fold into one rollup each only while they fit, so the bound is high
// enough for tens of thousands of clients a second (a batch of 16,384
// rollups takes 8 MB).
const batchSize = 16384

// batch is what the aggregator folds between publications: a rollup per
// key, in the order the keys came, and the index of each key's. Kept from
// one publication to the next, it allocates only when it grows.
type batch struct {
	rows []Rollup
	at   map[Key]int32
}

// aggregateEvery is how often the aggregator takes what is queued, and
// publishEvery how often it publishes what it folded (and on Flush, and
// when a batch is full). Taking events as they come would wake the
// aggregator for nearly every event under a moderate load, and publishing
// a batch each time would copy and merge a rollup per event: a tick keeps
// the wake-ups per tick, and a second of events of one key is published
// as one rollup. The queue holds QueueSize events for the tick (65,536 by
// default: 6.5 million events a second); the Memory store lags by up to a
// second.
const (
	aggregateEvery = 10 * time.Millisecond
	publishEvery   = time.Second
)

// aggregate folds queued events every aggregateEvery and publishes them
// every publishEvery and on Flush, until ctx ends, then drains the queue.
func (r *Recorder) aggregate(ctx context.Context) {
	batch := &batch{at: map[Key]int32{}}
	var blocked []Event
	t := time.NewTicker(aggregateEvery)
	defer t.Stop()
	publish := time.NewTicker(publishEvery)
	defer publish.Stop()
	for {
		select {
		case <-t.C:
			r.fold(batch, &blocked)
		case <-publish.C:
			r.drain(batch, &blocked)
		case done := <-r.flushNow:
			r.drain(batch, &blocked)
			if r.cfg.Sink == nil {
				close(done)
			} else {
				r.sinkNow <- done
			}
		case <-ctx.Done():
			r.drain(batch, &blocked)
			return
		}
	}
}

// fold folds every queued event into batch, publishing it whenever it is
// full.
func (r *Recorder) fold(batch *batch, blocked *[]Event) {
	for {
		select {
		case ev := <-r.queue:
			r.foldOne(batch, blocked, &ev)
			if len(batch.rows) >= batchSize || len(*blocked) >= batchSize {
				r.commit(batch, blocked)
			}
		default:
			return
		}
	}
}

// drain folds every queued event, publishes batch, and then the queued
// changes and the anomalies of the minutes that closed.
func (r *Recorder) drain(batch *batch, blocked *[]Event) {
	r.fold(batch, blocked)
	r.commit(batch, blocked)
	now := r.cfg.Now()
	var ls lists
take:
	for len(ls.changes) < changeQueue {
		select {
		case c := <-r.changes:
			ls.changes = append(ls.changes, c)
		default:
			break take
		}
	}
	if r.detector != nil {
		ls.anomalies = r.detector.closeUpTo(now.Unix())
		r.anomalies.Add(int64(len(ls.anomalies)))
		r.untracked.Store(r.detector.untracked)
	}
	if len(ls.changes) > 0 {
		r.memory.AddChanges(now, ls.changes)
	}
	if len(ls.anomalies) > 0 {
		r.memory.AddAnomalies(now, ls.anomalies)
	}
	if _, ok := r.cfg.Sink.(ListSink); ok && (len(ls.changes) > 0 || len(ls.anomalies) > 0) {
		r.mu.Lock()
		r.pendingLists.append(&ls)
		r.sinkDroppedEvents.Add(r.pendingLists.bound(r.cfg.MaxBacklog))
		r.mu.Unlock()
	}
}

// foldOne adds ev to batch.
func (r *Recorder) foldOne(batch *batch, blocked *[]Event, ev *Event) {
	k := keyOf(ev)
	i, ok := batch.at[k]
	if !ok {
		i = int32(len(batch.rows))
		batch.at[k] = i
		batch.rows = append(batch.rows, Rollup{Key: k})
	}
	batch.rows[i].add(ev)
	if !ev.Allowed && r.cfg.Sink != nil {
		*blocked = append(*blocked, *ev)
	}
	r.recorded.Add(1)
}

// commit moves batch into the Memory store and the pending rollups, and
// empties it.
func (r *Recorder) commit(batch *batch, blocked *[]Event) {
	rows := batch.rows
	if len(rows) == 0 {
		return
	}
	r.memory.Add(r.cfg.Now(), rows)
	if r.detector != nil {
		r.detector.add(rows) // sorts rows
	}
	if r.cfg.Sink != nil {
		r.mu.Lock()
		for i := range rows {
			ro := &rows[i]
			if have := r.pending[ro.Key]; have != nil {
				have.merge(ro)
			} else {
				c := *ro
				r.pending[ro.Key] = &c // the flusher copies it out, and drops it
			}
		}
		// Blocked events wait for the flusher in a bounded list: a flood of
		// refusals must not grow the process without limit.
		room := r.cfg.MaxBacklog - len(r.pendingBlocked)
		if over := len(*blocked) - max(room, 0); over > 0 {
			r.sinkDroppedEvents.Add(int64(over))
			*blocked = (*blocked)[:len(*blocked)-over]
		}
		r.pendingBlocked = append(r.pendingBlocked, *blocked...)
		r.mu.Unlock()
	}
	clear(batch.at)
	batch.rows = rows[:0]
	*blocked = (*blocked)[:0]
}
