package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// DefaultMaxInFlight is the bound on store calls in flight when
// Config.MaxInFlight is zero.
const DefaultMaxInFlight = 4096

// ErrTooManyInFlight is wrapped (with sluice.ErrStoreUnavailable) by the
// error of a call refused because Config.MaxInFlight store calls are
// already in flight: the store is too slow to keep up.
var ErrTooManyInFlight error = &fallbackError{"sluice: too many store calls in flight", store.FallbackOverloaded}

// The operations a job runs.
const (
	opCheck uint8 = iota
	opCheckAll
	opReset
	opOnce
	// opSync is a Check of the hot keys' leases: never gathered, and its
	// error is the store's own, a *store.PartialError included, so that
	// the leases the store did decide are kept.
	opSync
)

// A job is one store call, run on a goroutine of its own so that its
// caller can stop waiting at the deadline whatever the store does (a
// client may block past its context while it reconnects, for instance).
// The job owns copies of the requests and decisions: a caller that gave
// up may reuse its own buffers at once.
type job struct {
	op   uint8
	reqs []store.Request
	out  []sluice.Decision
	keys []string
	once store.Once  // of an opOnce
	b    store.Batch // the call of the store, on reqs and out

	replayed bool
	err      error
	// sent is set when the store call begins or, for a gathered check,
	// when a gathering goroutine takes it into a call, under the
	// gatherer's mu.
	sent atomic.Bool
	// done receives one value: doneFinished when the call returns in time,
	// or, for a gathered check, why the sweeper gave up on it.
	done chan uint8
	// state is jobRunning, then jobFinished (set by the job) or
	// jobAbandoned (set by its caller, or by the sweeper for a gathered
	// check), whichever comes first.
	state atomic.Int32

	// When a gathered check's caller stops waiting (see sweep): at
	// expires, when gone (its context's Done) is closed, or when the
	// store stalls (see stallDetector) for stall counted from start.
	gone    <-chan struct{}
	expires time.Time
	start   int64 // on the stall detector's awake clock
	stall   time.Duration
	queued  time.Time // when a gathered check was queued (Config.GatherWait)

	pool *sync.Pool // the guard's, which recycles it
}

// The values a job's done channel receives.
const (
	doneFinished      uint8 = iota // the call returned: err and out are the caller's
	doneGaveUp                     // the sweeper gave up on it after it was sent
	doneGaveUpUnsent               // the sweeper gave up on it before it was sent
	doneStalled                    // the sweeper gave up on it, sent, as the store stalled
	doneStalledUnsent              // the sweeper gave up on it, not sent, as the store stalled
)

const (
	jobRunning int32 = iota
	jobFinished
	jobAbandoned
)

func newJobValue() any { return &job{done: make(chan uint8, 1)} }

// newJob returns a job of op on copies of reqs, with room for n decisions.
// Jobs are recycled per guard: a job's channel stays with the guard that
// made it (and so within one testing/synctest bubble).
func (g *Guard) newJob(op uint8, reqs []store.Request, n int) *job {
	j := g.jobs.Get().(*job)
	j.pool = &g.jobs
	j.op = op
	j.reqs = append(j.reqs[:0], reqs...)
	j.out = grow(j.out, n)
	j.keys = j.keys[:0]
	j.once, j.replayed, j.err = store.Once{}, false, nil
	j.sent.Store(false)
	j.state.Store(jobRunning)
	j.stall = 0
	return j
}

func putJob(j *job) {
	if cap(j.reqs) > 1024 || cap(j.keys) > 1024 {
		return
	}
	clear(j.reqs[:cap(j.reqs)])
	clear(j.keys[:cap(j.keys)])
	j.once, j.b, j.gone = store.Once{}, store.Batch{}, nil
	j.pool.Put(j)
}

// whole returns the error of a store call that failed in part as the
// failure of the whole call: the guard's callers answer a failed call by
// its failure mode, and the indexes of a *store.PartialError would not be
// theirs (in a gathered call, or when the guard decided some of their
// requests in process).
func whole(err error) error {
	if err == nil {
		return nil // before errors.As, whose target would escape: no allocation per call
	}
	var partial *store.PartialError
	if errors.As(err, &partial) {
		return partial.Err
	}
	return err
}

// exec runs j against the store, and records whether the store answered.
func (g *Guard) exec(ctx context.Context, j *job) {
	j.sent.Store(true)
	sent := time.Now()
	var err error
	switch j.op {
	case opCheck, opSync:
		j.b = store.Batch{Reqs: j.reqs, Out: j.out}
		err = g.inner.Do(ctx, &j.b)
	case opCheckAll:
		j.b = store.Batch{Reqs: j.reqs, Out: j.out, All: true}
		err = g.inner.Do(ctx, &j.b)
	case opReset:
		err = g.inner.Reset(ctx, j.keys...)
	case opOnce:
		j.b = store.Batch{Reqs: j.reqs, Out: j.out, All: true, Once: &j.once}
		err = g.inner.Do(ctx, &j.b)
		j.replayed = j.once.Replayed
	}
	g.noteAnswer(sent, err)
	if j.op == opCheck {
		err = whole(err)
	}
	j.err = err
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
	j.done <- doneFinished
}

// run runs j under the breaker, the deadline and the stall timeout and,
// when it returns in time, copies its decisions to out (and its replayed
// flag to replayed[0]). It consumes j. The caller waits at most until the
// deadline (its own, or the guard's) or until the store stalls, plus the
// scheduling delay of one goroutine waking up and, for a gathered check,
// the sweeper's period.
func (g *Guard) run(ctx context.Context, j *job, out []sluice.Decision, replayed ...*bool) error {
	if err := ctx.Err(); err != nil {
		// The caller is gone already: nothing is sent, so nothing is
		// charged, and the breaker learns nothing of the store.
		putJob(j)
		return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
	}
	stall, started := g.stall.timeout(), time.Now()
	since := g.stall.clock(started)
	if !g.nodes && g.stall.blocked(started, stall) {
		// The store stalled and has answered nothing since: fail at
		// once, as an open breaker does. Not on a store of several
		// nodes (a Redis Cluster), where one stalled node must not fail
		// the checks of the others.
		putJob(j)
		g.stats.storeErrors.Add(1)
		return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, ErrStalled)
	}
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
	if stall > 0 {
		g.stall.beat.start()
	}
	expires, callerFirst := started.Add(g.deadline), false
	if dl, ok := ctx.Deadline(); ok && dl.Before(expires) {
		expires, callerFirst = dl, true
	}
	notSent := false
	g.stats.storeCalls.Add(1)
	var err error
	if j.op == opCheck && g.gather.max > 0 {
		// A gathered check waits on its job alone; the sweeper ends the
		// wait at the deadline, when the store stalls or when ctx ends,
		// whichever comes first.
		j.gone, j.expires, j.start, j.stall, j.queued = ctx.Done(), expires, since, stall, started
		g.gatherJob(j)
		switch v := <-j.done; v {
		case doneFinished:
			err = sentErr(j.err)
			copy(out, j.out)
			putJob(j)
		default: // the job is no longer ours: it recycles itself
			err = g.gaveUp(ctx, v == doneStalled || v == doneStalledUnsent, v == doneGaveUp || v == doneStalled)
			// A check the store never saw because the server was slow
			// to send it says nothing of the store; one the store never
			// saw because it answers nothing does.
			notSent = v == doneGaveUpUnsent
		}
	} else {
		err, notSent = g.await(ctx, j, out, since, stall, replayed...)
	}
	if err != nil {
		g.stats.storeErrors.Add(1)
		if errors.Is(err, ErrStalled) {
			g.stall.trip(time.Now())
		}
		if !errors.Is(err, sluice.ErrStoreUnavailable) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			err = fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
		}
	}
	g.obs.StoreCall(time.Since(started), err)
	if done != nil {
		if notSent && err != nil {
			done(errNotSent)
		} else {
			done(breakerOutcome(ctx, err, callerFirst))
		}
	}
	return err
}

// await runs j, a job that is not a gathered check, on a goroutine of its
// own, and waits for it until the deadline, until ctx ends or until the
// store stalls (counted from since, on the stall detector's awake clock),
// whichever comes first. On time, it copies j's decisions to out (and its replayed
// flag to replayed[0]) and recycles j; otherwise it leaves j to recycle
// itself and reports whether j was sent.
func (g *Guard) await(ctx context.Context, j *job, out []sluice.Decision, since int64, stall time.Duration, replayed ...*bool) (err error, notSent bool) {
	cctx, cancel := context.WithTimeout(ctx, g.deadline)
	defer cancel()
	go g.runJob(cctx, j)
	var wake <-chan time.Time
	var t *time.Timer
	if stall > 0 {
		t = time.NewTimer(g.stall.wakeIn(since, time.Now(), stall))
		defer t.Stop()
		wake = t.C
	}
wait:
	for {
		stalled := false
		select {
		case <-j.done:
			break wait
		case <-cctx.Done():
		case now := <-wake:
			if !g.stall.stalled(since, now, stall) {
				t.Reset(g.stall.wakeIn(since, time.Now(), stall))
				continue
			}
			stalled = true
		}
		sent := j.sent.Load() // before the job may be recycled
		if j.state.CompareAndSwap(jobRunning, jobAbandoned) {
			// The job finishes on its own (its context is cancelled
			// when await returns) and recycles itself.
			return g.gaveUp(ctx, stalled, sent), !sent && !stalled
		}
		<-j.done // it finished at the same instant
		break
	}
	err = sentErr(j.err)
	copy(out, j.out)
	if len(replayed) > 0 {
		*replayed[0] = j.replayed
	}
	putJob(j)
	return err, false
}
