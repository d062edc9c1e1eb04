package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/store"
)

// DefaultMaxInFlight is the bound on store calls in flight when
// Config.MaxInFlight is zero.
const DefaultMaxInFlight = 4096

// ErrTooManyInFlight is wrapped (with sluice.ErrStoreUnavailable) by the
// error of a call refused because Config.MaxInFlight store calls are
// already in flight: the store is too slow to keep up.
var ErrTooManyInFlight = errors.New("sluice: too many store calls in flight")

// The operations a job runs.
const (
	opCheck uint8 = iota
	opCheckAll
	opReset
	opOnce
)

// A job is one store call, run on a goroutine of its own so that its
// caller can stop waiting at the deadline whatever the store does (a
// client may block past its context while it reconnects, for instance).
// The job owns copies of the requests and decisions: a caller that gave
// up may reuse its own buffers at once.
type job struct {
	op      uint8
	reqs    []store.Request
	out     []sluice.Decision
	keys    []string
	once    engine.IdempotentStore
	idemKey string
	ttl     time.Duration

	replayed bool
	err      error
	sent     atomic.Bool   // the store call has begun
	done     chan struct{} // receives one value when the call returns
	// state is jobRunning, then jobFinished (set by the job) or
	// jobAbandoned (set by its caller), whichever comes first.
	state atomic.Int32
}

const (
	jobRunning int32 = iota
	jobFinished
	jobAbandoned
)

var jobPool = sync.Pool{New: func() any { return &job{done: make(chan struct{}, 1)} }}

// newJob returns a job of op on copies of reqs, with room for n decisions.
func (g *Guard) newJob(op uint8, reqs []store.Request, n int) *job {
	j := jobPool.Get().(*job)
	j.op = op
	j.reqs = append(j.reqs[:0], reqs...)
	j.out = grow(j.out, n)
	j.keys = j.keys[:0]
	j.once, j.idemKey, j.ttl, j.replayed, j.err = nil, "", 0, false, nil
	j.sent.Store(false)
	j.state.Store(jobRunning)
	return j
}

func putJob(j *job) {
	if cap(j.reqs) > 1024 || cap(j.keys) > 1024 {
		return
	}
	clear(j.reqs[:cap(j.reqs)])
	clear(j.keys[:cap(j.keys)])
	j.once = nil
	jobPool.Put(j)
}

// exec runs j against the store.
func (g *Guard) exec(ctx context.Context, j *job) {
	j.sent.Store(true)
	switch j.op {
	case opCheck:
		j.err = g.inner.Check(ctx, j.reqs, j.out)
	case opCheckAll:
		j.err = g.inner.CheckAll(ctx, j.reqs, j.out)
	case opReset:
		j.err = g.inner.Reset(ctx, j.keys...)
	case opOnce:
		j.replayed, j.err = j.once.CheckAllOnce(ctx, j.idemKey, j.ttl, j.reqs, j.out)
	}
}

// runJob runs j on its own goroutine and hands it back to its caller, or
// recycles it when the caller gave up.
func (g *Guard) runJob(ctx context.Context, j *job) {
	g.exec(ctx, j)
	g.finish(j)
}

// finish hands j back to its caller, or recycles it when the caller gave
// up.
func (g *Guard) finish(j *job) {
	g.inflight.Add(-1)
	if !j.state.CompareAndSwap(jobRunning, jobFinished) {
		putJob(j) // abandoned: nobody waits for it
		return
	}
	j.done <- struct{}{}
}

// run runs j under the breaker and the deadline and, when it returns in
// time, copies its decisions to out (and its replayed flag to
// replayed[0]). It consumes j. The caller waits at most until the
// deadline (its own, or the guard's), plus the scheduling delay of one
// goroutine waking up.
func (g *Guard) run(ctx context.Context, j *job, out []sluice.Decision, replayed ...*bool) error {
	var done func(error)
	if g.cb != nil {
		var err error
		done, err = g.cb.Allow()
		if err != nil {
			putJob(j)
			g.stats.refused.Add(1)
			return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, ErrBreakerOpen)
		}
	}
	if n := g.inflight.Add(1); n > g.maxInFlight {
		g.inflight.Add(-1)
		putJob(j)
		err := fmt.Errorf("%w: %w (%d)", sluice.ErrStoreUnavailable, ErrTooManyInFlight, g.maxInFlight)
		g.stats.storeErrors.Add(1)
		if done != nil {
			done(err)
		}
		return err
	}
	started := time.Now()
	notSent := false
	g.stats.storeCalls.Add(1)
	// The caller stops waiting at the deadline (stop) or when its own
	// context ends (gone), whichever comes first.
	var (
		stop   <-chan time.Time
		gone   <-chan struct{}
		cause  func() error
		cancel = func() {}
	)
	if j.op == opCheck && g.gather.max > 0 {
		// A gathered call has a context of its own, so the caller needs
		// only a timer, taken from a pool: no context per check.
		d := g.deadline
		if dl, ok := ctx.Deadline(); ok {
			d = min(d, time.Until(dl))
		}
		t := getTimer(d)
		defer putTimer(t)
		stop, gone, cause = t.C, ctx.Done(), ctx.Err
		g.gatherJob(j)
	} else {
		cctx, c := context.WithTimeout(ctx, g.deadline)
		gone, cause, cancel = cctx.Done(), cctx.Err, c
		go g.runJob(cctx, j)
	}
	var err error
	abandon := func(why error) {
		sent := j.sent.Load() // before the job may be recycled
		if j.state.CompareAndSwap(jobRunning, jobAbandoned) {
			// The job finishes on its own (its context is cancelled
			// below, or ends at the gathered call's deadline) and
			// recycles itself.
			err = fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, why)
			notSent = !sent
			return
		}
		<-j.done // it finished at the same instant
		err = j.err
		copy(out, j.out)
		if len(replayed) > 0 {
			*replayed[0] = j.replayed
		}
		putJob(j)
	}
	select {
	case <-j.done:
		err = j.err
		copy(out, j.out)
		if len(replayed) > 0 {
			*replayed[0] = j.replayed
		}
		putJob(j)
	case <-stop:
		abandon(context.DeadlineExceeded)
	case <-gone:
		abandon(cause())
	}
	cancel()
	if err != nil {
		g.stats.storeErrors.Add(1)
		if !errors.Is(err, sluice.ErrStoreUnavailable) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			err = fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
		}
	}
	g.obs.StoreCall(time.Since(started), err)
	if done != nil {
		if notSent && err != nil {
			done(errNotSent)
		} else {
			done(breakerOutcome(ctx, err))
		}
	}
	return err
}

// DefaultGatherers is Config.Gatherers when it is zero.
const DefaultGatherers = 2

// MaxGathered is the most requests one gathered store call decides.
const MaxGathered = 256

// gatherer holds the checks waiting for a store call (see
// Config.Gatherers).
type gatherer struct {
	mu      sync.Mutex
	queue   []*job
	running int // gathering goroutines, at most max
	max     int
}

// gatherJob queues j, an opCheck job, and starts a gathering goroutine
// when fewer than the maximum run: with the store idle, j has a call of its
// own at once.
func (g *Guard) gatherJob(j *job) {
	q := &g.gather
	q.mu.Lock()
	q.queue = append(q.queue, j)
	if q.running < q.max {
		q.running++
		q.mu.Unlock()
		go g.gatherLoop()
		return
	}
	q.mu.Unlock()
}

// gatherScratch is the scratch space of a gathering goroutine.
type gatherScratch struct {
	batch []*job
	reqs  []store.Request
	out   []sluice.Decision
}

var gatherPool = sync.Pool{New: func() any { return new(gatherScratch) }}

// gatherLoop makes store calls of the queued checks until none is left.
func (g *Guard) gatherLoop() {
	q := &g.gather
	sc := gatherPool.Get().(*gatherScratch)
	batch, reqs, out := sc.batch, sc.reqs, sc.out
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.running--
			q.mu.Unlock()
			if cap(batch) <= MaxGathered {
				sc.batch, sc.reqs, sc.out = batch[:0], reqs[:0], out[:0]
				gatherPool.Put(sc)
			}
			return
		}
		n, k := 0, 0
		for k < len(q.queue) && (k == 0 || n+len(q.queue[k].reqs) <= MaxGathered) {
			n += len(q.queue[k].reqs)
			k++
		}
		batch = append(batch[:0], q.queue[:k]...)
		rest := copy(q.queue, q.queue[k:])
		clear(q.queue[rest:])
		q.queue = q.queue[:rest]
		q.mu.Unlock()
		reqs, out = g.execGathered(batch, reqs, out)
		clear(batch)
	}
}

// execGathered decides the checks of batch in one store call and hands
// each job back. A job whose caller gave up before the call is not sent:
// its caller has answered already, so it must not be charged. reqs and out
// are scratch space, returned for reuse.
func (g *Guard) execGathered(batch []*job, reqs []store.Request, out []sluice.Decision) ([]store.Request, []sluice.Decision) {
	live := batch[:0]
	for _, j := range batch {
		if j.state.Load() == jobAbandoned {
			g.finish(j)
			continue
		}
		live = append(live, j)
	}
	if len(live) == 0 {
		return reqs, out
	}
	g.stats.gatheredCalls.Add(1)
	g.stats.gatheredJobs.Add(int64(len(live)))
	g.obs.Gathered(len(live))
	ctx, cancel := context.WithTimeout(context.Background(), g.deadline)
	defer cancel()
	if len(live) == 1 {
		g.exec(ctx, live[0]) // marks it sent
		g.finish(live[0])
		return reqs, out
	}
	reqs = reqs[:0]
	for _, j := range live {
		j.sent.Store(true)
		reqs = append(reqs, j.reqs...)
	}
	out = grow(out, len(reqs))
	err := g.inner.Check(ctx, reqs, out)
	if err != nil && !errors.Is(err, sluice.ErrStoreUnavailable) {
		// One invalid request fails the whole call: decide each job on
		// its own, so that the error is only its own.
		for _, j := range live {
			g.exec(ctx, j)
			g.finish(j)
		}
	} else {
		off := 0
		for _, j := range live {
			n := len(j.reqs)
			copy(j.out, out[off:off+n])
			j.err = err
			off += n
			g.finish(j)
		}
	}
	clear(reqs) // drop the references to keys and params
	return reqs[:0], out
}

// timerPool holds stopped timers for the callers of gathered checks.
var timerPool sync.Pool

// getTimer returns a timer that fires after d.
func getTimer(d time.Duration) *time.Timer {
	if t, ok := timerPool.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

// putTimer stops t and pools it. Since Go 1.23 a stopped timer's channel
// holds no stale value, so the next Reset starts clean.
func putTimer(t *time.Timer) {
	t.Stop()
	timerPool.Put(t)
}
