package analytics

import (
	"context"
	"time"
)

// sinkTimeout bounds one write to the Sink.
const sinkTimeout = 30 * time.Second

// lists are changes and anomalies on their way to a ListSink.
type lists struct {
	changes   []Change
	anomalies []Anomaly
}

func (l *lists) empty() bool { return len(l.changes) == 0 && len(l.anomalies) == 0 }

// append adds o's rows to l.
func (l *lists) append(o *lists) {
	l.changes = append(l.changes, o.changes...)
	l.anomalies = append(l.anomalies, o.anomalies...)
}

// bound drops the oldest rows beyond n of each list, and returns how many
// it dropped.
func (l *lists) bound(n int) int64 {
	var dropped int64
	if over := len(l.changes) - n; over > 0 {
		dropped += int64(over)
		l.changes = append(l.changes[:0], l.changes[over:]...)
	}
	if over := len(l.anomalies) - n; over > 0 {
		dropped += int64(over)
		l.anomalies = append(l.anomalies[:0], l.anomalies[over:]...)
	}
	return dropped
}

// backlog is what the flusher has still to write.
type backlog struct {
	rollups []Rollup
	blocked []Event
	lists   lists
}

// flushLoop offers the pending rollups to the Sink every FlushInterval and
// on Flush, until the aggregator has ended; then it offers them once more.
func (r *Recorder) flushLoop(ctx context.Context, aggregated <-chan struct{}) {
	if r.cfg.Sink == nil {
		<-aggregated
		return
	}
	var b backlog
	t := time.NewTicker(r.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case done := <-r.sinkNow:
			r.flushSink(&b)
			close(done)
			continue
		case <-aggregated:
			r.flushSink(&b)
			return
		}
		r.flushSink(&b)
	}
}

// flushSink writes the backlog and the pending rows to the Sink, and keeps
// in b what is left to write: nothing on success, the bounded backlog on
// failure.
func (r *Recorder) flushSink(b *backlog) {
	r.mu.Lock()
	for _, ro := range r.pending {
		b.rollups = append(b.rollups, *ro)
	}
	clear(r.pending)
	b.blocked = append(b.blocked, r.pendingBlocked...)
	r.pendingBlocked = r.pendingBlocked[:0]
	b.lists.append(&r.pendingLists)
	r.pendingLists = lists{}
	r.mu.Unlock()
	if len(b.rollups) == 0 && len(b.blocked) == 0 && b.lists.empty() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sinkTimeout)
	defer cancel()
	var err error
	if len(b.rollups) > 0 || len(b.blocked) > 0 {
		err = r.cfg.Sink.Write(ctx, b.rollups, b.blocked)
	}
	if ls, ok := r.cfg.Sink.(ListSink); err == nil && ok && !b.lists.empty() {
		if err = ls.WriteLists(ctx, b.lists.changes, b.lists.anomalies); err == nil {
			b.lists = lists{}
		}
		// The rollups are written: only the lists wait for the next flush.
		b.rollups, b.blocked = b.rollups[:0], b.blocked[:0]
	}
	r.flushes.Add(1)
	r.sinkFailing.Store(err != nil)
	if err == nil {
		r.backlog.Store(0)
		b.rollups, b.blocked = b.rollups[:0], b.blocked[:0]
		return
	}
	r.sinkErrors.Add(1)
	// Keep the newest rows: an operator looking at the dashboard after an
	// outage cares more about the last minutes than the first ones.
	if over := len(b.rollups) - r.cfg.MaxBacklog; over > 0 {
		r.sinkDroppedRows.Add(int64(over))
		b.rollups = append(b.rollups[:0], b.rollups[over:]...)
	}
	if over := len(b.blocked) - r.cfg.MaxBacklog; over > 0 {
		r.sinkDroppedEvents.Add(int64(over))
		b.blocked = append(b.blocked[:0], b.blocked[over:]...)
	}
	r.sinkDroppedEvents.Add(b.lists.bound(r.cfg.MaxBacklog))
	r.backlog.Store(int64(len(b.rollups)))
}
