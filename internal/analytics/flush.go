package analytics

import (
	"context"
	"time"
)

// sinkTimeout bounds one write to the Sink.
const sinkTimeout = 30 * time.Second

// flushLoop offers the pending rollups to the Sink every FlushInterval and
// on Flush, until the aggregator has ended; then it offers them once more.
func (r *Recorder) flushLoop(ctx context.Context, aggregated <-chan struct{}) {
	if r.cfg.Sink == nil {
		<-aggregated
		return
	}
	var backlog []Rollup
	var backlogBlocked []Event
	t := time.NewTicker(r.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case done := <-r.sinkNow:
			backlog, backlogBlocked = r.flushSink(backlog, backlogBlocked)
			close(done)
			continue
		case <-aggregated:
			r.flushSink(backlog, backlogBlocked)
			return
		}
		backlog, backlogBlocked = r.flushSink(backlog, backlogBlocked)
	}
}

// flushSink writes the backlog and the pending rows to the Sink, and
// returns what is left to write: nothing on success, the bounded backlog on
// failure.
func (r *Recorder) flushSink(backlog []Rollup, blocked []Event) ([]Rollup, []Event) {
	r.mu.Lock()
	for _, ro := range r.pending {
		backlog = append(backlog, *ro)
	}
	clear(r.pending)
	blocked = append(blocked, r.pendingBlocked...)
	r.pendingBlocked = r.pendingBlocked[:0]
	r.mu.Unlock()
	if len(backlog) == 0 && len(blocked) == 0 {
		return backlog, blocked
	}
	ctx, cancel := context.WithTimeout(context.Background(), sinkTimeout)
	err := r.cfg.Sink.Write(ctx, backlog, blocked)
	cancel()
	r.flushes.Add(1)
	r.sinkFailing.Store(err != nil)
	if err == nil {
		r.backlog.Store(0)
		return backlog[:0], blocked[:0]
	}
	r.sinkErrors.Add(1)
	// Keep the newest rows: an operator looking at the dashboard after an
	// outage cares more about the last minutes than the first ones.
	if over := len(backlog) - r.cfg.MaxBacklog; over > 0 {
		r.sinkDroppedRows.Add(int64(over))
		backlog = append(backlog[:0], backlog[over:]...)
	}
	if over := len(blocked) - r.cfg.MaxBacklog; over > 0 {
		r.sinkDroppedEvents.Add(int64(over))
		blocked = append(blocked[:0], blocked[over:]...)
	}
	r.backlog.Store(int64(len(backlog)))
	return backlog, blocked
}
