package engine

import "context"

// Begin begins a request of about n checks, to be decided into a, before
// the transport decodes it. A request of more than Config.BulkChecks
// checks waits for its turn among large requests (Config.BulkShare), and
// its decoding, its decisions (BatchCheckInto with a) and the writing of
// its answer take their share of the time as its slices, until a.End: a
// client sending requests of a thousand checks back to back would
// otherwise take the CPU to decode and answer them (some milliseconds
// each) from every other client's checks. A request that turns out to
// hold fewer checks is decided as a small one. a.End must be called,
// after the answer is written.
func (e *Engine) Begin(ctx context.Context, n int, a *BatchAnswer) {
	if e.share.Bulk(n) {
		a.held, a.holding = e.share.StartBulk(ctx), true
	}
}

// End ends the request begun by Engine.Begin, if any.
func (a *BatchAnswer) End() {
	a.held.End()
	a.holding = false
}
