// Package share keeps requests of many checks from crowding out the small
// ones. A batch of 1,000 checks, or an Envoy call of 64 descriptors, makes
// the server validate, plan and answer that many checks at once; sent
// back to back by one client, such requests would hold the CPU that the
// single checks of every other client wait for.
//
// A Gate splits requests in two: bulk ones (more checks than a threshold)
// and small ones. While they contend, that is while small requests are in
// progress or were within the last 10ms, bulk work may take at most a
// share of the time and of the CPUs. A bulk request does its work in
// slices; before each it lets the small requests ready to run go first,
// then waits while bulk work has taken more than its share of the time
// lately, or while as many bulk slices run as its share of GOMAXPROCS
// (one at least). When no small request is about, bulk work runs at
// once, however much of the time and of the CPUs it takes. Waiting bulk
// requests are woken in the order they began, each when it may go: when
// a slice ends, when the time owed is repaid, or when the small requests
// are gone; none wakes to look again in vain while they are about.
//
// Time is counted on the wall clock, whatever the number of bulk requests
// at work at once: bulk time is the time during which at least one bulk
// slice runs. A bulk request's waits on the store are not slices (it
// pauses its turn around them, and only them: the work it does in process
// around a store call is part of a slice): waiting on the store holds
// neither a CPU nor a share.
//
// A gate never refuses a request and never changes a decision: it only
// delays bulk requests, and never past half of the time their context
// left them when they began, so that a delay cannot make a check miss its
// deadline.
package share

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	// DefaultShare is the share of the time and of the CPUs that bulk
	// work may take while it contends with small requests.
	DefaultShare = 0.1
	// DefaultBulkChecks is the most checks of a small request.
	DefaultBulkChecks = 16
)

// burst is the bulk time a gate lends ahead: a bulk slice may start when
// bulk work has taken its share lately, give or take this much.
const burst = time.Millisecond

// recent is how long after a small request ends bulk work still contends
// with small ones: a client pacing its checks is between two of them
// most of the time, and wants the CPU when the next one comes.
const recent = 10 * time.Millisecond

// maxDebt bounds the bulk time a gate remembers beyond the share, so that
// a long slice is not paid for by pauses of many seconds.
const maxDebt = time.Second

// Config holds a gate's knobs. The zero value is usable: bulk requests are
// those of more than 16 checks, and they may take a tenth of the time
// and of the CPUs while they contend with small ones.
type Config struct {
	// Share is the share of the time and of the CPUs, above 0 and at most
	// 1, that bulk work may take while it contends with small requests.
	// Zero means DefaultShare; 1 (or more) turns the gate off: New then
	// returns nil.
	Share float64
	// BulkChecks is the most checks of a small request; requests of more
	// are bulk. Zero means DefaultBulkChecks.
	BulkChecks int
	// CPUs is the number of CPUs the share is of; zero means
	// runtime.GOMAXPROCS(0) when New is called.
	CPUs int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Gate shares the time between bulk and small requests. A nil *Gate lets
// every request through at once. A Gate is safe for concurrent use.
type Gate struct {
	share      float64
	bulkChecks int
	lanes      int // bulk slices that may run at once while contended
	now        func() time.Time

	// bulk counts the bulk requests in progress, waiting ones included;
	// small ones count themselves in small, and note their end in
	// smallEnd (Unix nanoseconds), only while it is above 0, so that with
	// no bulk request about a small one costs one atomic load.
	bulk     atomic.Int64
	small    atomic.Int64
	smallEnd atomic.Int64

	// waits and waited count the waits of bulk slices and their time.
	waits  atomic.Int64
	waited atomic.Int64

	// seq numbers the bulk requests in the order they began.
	seq atomic.Uint64

	mu sync.Mutex
	// running counts the bulk slices running.
	running int
	// waiting holds the waiting bulk slices, oldest request first; the
	// first one keeps the time (of the debt repaid, of the end of the
	// contention), the others sleep until it goes.
	waiting []*waiter
	// last is when budget was brought up to date.
	last time.Time
	// budget is the bulk time that may still be taken ahead of the
	// share: it grows by share of the time elapsed, up to burst, and
	// shrinks by the time bulk slices run while they contend with small
	// requests, down to -maxDebt.
	budget time.Duration
}

// New returns a gate for cfg, or nil (no gate) when cfg.Share is 1 or
// more.
func New(cfg Config) *Gate {
	if cfg.Share >= 1 {
		return nil
	}
	g := &Gate{share: cfg.Share, bulkChecks: cfg.BulkChecks, now: cfg.Now, budget: burst}
	if g.share <= 0 {
		g.share = DefaultShare
	}
	if g.bulkChecks <= 0 {
		g.bulkChecks = DefaultBulkChecks
	}
	if g.now == nil {
		g.now = time.Now
	}
	cpus := cfg.CPUs
	if cpus <= 0 {
		cpus = runtime.GOMAXPROCS(0)
	}
	g.lanes = max(1, int(g.share*float64(cpus)+0.5))
	g.last = g.now()
	return g
}

// Stats counts what a gate did.
type Stats struct {
	// Waits counts the waits of bulk requests (a long one counts once
	// per time it is woken), and Waited their time.
	Waits  int64
	Waited time.Duration
}

// Stats returns the gate's counts so far; zero for a nil gate.
func (g *Gate) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	return Stats{Waits: g.waits.Load(), Waited: time.Duration(g.waited.Load())}
}

// Bulk reports whether a request of n checks is bulk.
func (g *Gate) Bulk(n int) bool { return g != nil && n > g.bulkChecks }

// StartSmall marks a small request in progress; EndSmall(counted), with
// what it returned, marks its end.
func (g *Gate) StartSmall() (counted bool) {
	if g == nil || g.bulk.Load() == 0 {
		return false
	}
	g.small.Add(1)
	return true
}

// EndSmall marks the end of a small request; counted is what its
// StartSmall returned.
func (g *Gate) EndSmall(counted bool) {
	if counted {
		g.smallEnd.Store(g.now().UnixNano())
		g.small.Add(-1)
	}
}

// contended reports whether small requests are in progress, or were
// recently.
func (g *Gate) contended(now time.Time) bool {
	if g.small.Load() > 0 {
		return true
	}
	d := now.UnixNano() - g.smallEnd.Load()
	return d >= 0 && d < int64(recent)
}

// Turn is one bulk request's passage through a gate: its zero value, or
// one from a nil gate, never waits.
type Turn struct {
	g *Gate
	// running is set while the request's slice runs (not paused).
	running bool
	// until is when the request stops waiting, whatever the share: half
	// of the time its context had left when it began; zero for a context
	// without a deadline.
	until time.Time
	// free is set past until: the request's slices run at once.
	free bool
	// w is the request's place in the gate's queue while it waits; made
	// at its first wait.
	w *waiter
	// seq is the request's number in the order bulk requests began.
	seq uint64
}

// waiter is a waiting bulk slice.
type waiter struct {
	seq  uint64
	wake chan struct{} // of capacity 1: a wake-up is never lost
}

// StartBulk starts a bulk request: it waits for its first slice (see
// Next), and returns the Turn whose Next starts the others and whose End
// ends the request.
func (g *Gate) StartBulk(ctx context.Context) Turn {
	if g == nil {
		return Turn{}
	}
	t := Turn{g: g, seq: g.seq.Add(1)}
	if d, ok := ctx.Deadline(); ok {
		now := g.now()
		t.until = now.Add(d.Sub(now) / 2)
	}
	g.bulk.Add(1)
	t.begin(ctx)
	return t
}

// Next ends the request's slice of work and starts the next one, after
// waiting while bulk work has taken more than its share of the time, or
// the other bulk slices running fill its share of the CPUs (and it
// contends with small requests). Call it every few dozen checks. A nil
// Turn never waits.
func (t *Turn) Next(ctx context.Context) {
	if t == nil || t.g == nil {
		return
	}
	if t.running {
		t.running = false
		// The request takes its lane back at once unless it must wait:
		// waking a waiter for it would be in vain.
		t.g.leave(false)
	}
	t.begin(ctx)
}

// Pause ends the request's slice of work, before a wait that holds no
// CPU (a store call); Next (or Resume) starts the next one.
func (t *Turn) Pause() {
	if t == nil || t.g == nil || !t.running {
		return
	}
	t.running = false
	t.g.leave(true)
}

// Resume starts the next slice of a paused request, as Next does.
func (t *Turn) Resume(ctx context.Context) {
	if t == nil || t.g == nil || t.running {
		return
	}
	t.begin(ctx)
}

// End ends the request's last slice, and the request.
func (t *Turn) End() {
	if t.g == nil {
		return
	}
	t.Pause()
	t.g.bulk.Add(-1)
	t.g = nil
}

// begin waits for a slice's turn, then counts it running. It stops
// waiting at t.until and when ctx is done: the slice then runs anyway.
func (t *Turn) begin(ctx context.Context) {
	g := t.g
	if g.small.Load() > 0 {
		// Let the goroutines of small requests ready to run go first:
		// the scheduler would otherwise let a bulk request that never
		// blocks run on for up to 10ms before them.
		runtime.Gosched()
	}
	var timer *time.Timer
	queued := false
	for {
		now := g.now()
		contended := g.contended(now)
		g.mu.Lock()
		g.update(now, contended)
		if !t.until.IsZero() && !now.Before(t.until) {
			t.free = true
		}
		if t.free || !contended || ctx.Err() != nil || g.budget >= 0 && g.running < g.lanes {
			g.running++
			if queued {
				g.dequeue(t.w)
			}
			g.mu.Unlock()
			break
		}
		joined := !queued
		if joined {
			if t.w == nil {
				t.w = &waiter{seq: t.seq, wake: make(chan struct{}, 1)}
			}
			g.enqueue(t.w)
			queued = true
		}
		wait := time.Duration(-1) // none: a wake-up, ctx or until ends it
		if g.waiting[0] == t.w {
			wait = g.untilChange(now)
		} else if joined && g.running < g.lanes {
			// A lane this request left (Next) is free, which the first
			// waiting slice was not woken for: it keeps the time now.
			g.waiting[0].poke()
		}
		g.mu.Unlock()
		if !t.until.IsZero() && (wait < 0 || t.until.Sub(now) < wait) {
			wait = t.until.Sub(now)
		}
		var tick <-chan time.Time
		if wait >= 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			tick = timer.C
		}
		select {
		case <-t.w.wake:
		case <-tick:
		case <-ctx.Done():
		}
		g.waits.Add(1)
		g.waited.Add(int64(g.now().Sub(now)))
	}
	if timer != nil {
		timer.Stop()
	}
	t.running = true
}

// untilChange returns how long the first waiting slice may sleep before
// it might go, when no slice ends meanwhile: until the debt is repaid if
// no slice runs (while one runs it grows, and its end wakes the waiter),
// and until the small requests may be gone. Requires mu held.
func (g *Gate) untilChange(now time.Time) time.Duration {
	// While a small request is in progress, the contention lasts at
	// least recent more.
	wait := recent
	if g.small.Load() == 0 {
		wait = time.Duration(g.smallEnd.Load() + int64(recent) - now.UnixNano())
	}
	if g.running == 0 && g.budget < 0 {
		wait = min(wait, time.Duration(float64(-g.budget)/g.share))
	}
	return max(wait, 0)
}

// enqueue puts w among the waiting slices, after those of requests that
// began before its own. Requires mu held.
func (g *Gate) enqueue(w *waiter) {
	i := len(g.waiting)
	for i > 0 && g.waiting[i-1].seq > w.seq {
		i--
	}
	g.waiting = slices.Insert(g.waiting, i, w)
}

// dequeue takes w out of the waiting slices; when it was the first, the
// next one is woken to keep the time, or to go too. Requires mu held.
func (g *Gate) dequeue(w *waiter) {
	i := slices.Index(g.waiting, w)
	g.waiting = slices.Delete(g.waiting, i, i+1)
	select {
	case <-w.wake: // a wake-up it did not wait for
	default:
	}
	if i == 0 && len(g.waiting) > 0 {
		g.waiting[0].poke()
	}
}

// poke wakes w, or has its next wait end at once.
func (w *waiter) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// leave counts a slice no longer running; wake has it wake the first
// waiting slice, which may now take the lane, or must now keep the time
// of the debt. A slice that starts again at once (Next) does not: when it
// must wait instead, begin wakes the first.
func (g *Gate) leave(wake bool) {
	now := g.now()
	contended := g.contended(now)
	g.mu.Lock()
	g.update(now, contended)
	g.running--
	if wake && g.running < g.lanes && len(g.waiting) > 0 {
		g.waiting[0].poke()
	}
	g.mu.Unlock()
}

// update brings the budget up to now: it grows by the share of the time
// elapsed, and shrinks by the time bulk slices ran meanwhile, if bulk and
// small requests contend now. Requires mu held.
func (g *Gate) update(now time.Time, contended bool) {
	d := now.Sub(g.last)
	if d <= 0 {
		return
	}
	g.last = now
	g.budget += time.Duration(float64(d) * g.share)
	if g.running > 0 && contended {
		g.budget -= d
	}
	g.budget = min(max(g.budget, -maxDebt), burst)
}
