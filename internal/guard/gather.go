package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// DefaultGatherers is Config.Gatherers when it is zero.
const DefaultGatherers = 2

// MaxGathered is the most requests one gathered store call decides.
const MaxGathered = 256

// DefaultGatherFill is Config.GatherFill when it is zero.
const DefaultGatherFill = 32

// MaxGatherWait is the longest Config.GatherWait.
const MaxGatherWait = 10 * time.Millisecond

// gatherer holds the checks waiting for a store call (see
// Config.Gatherers). Every job in queue or in an active batch is running
// or abandoned, never recycled: a job is recycled only once out of both,
// so the sweeper, which works under mu, never sees a job in its next life.
type gatherer struct {
	mu       sync.Mutex
	queue    []*job
	active   []*gatherScratch // the scratch (and batch) of each store call in flight
	running  int              // gathering goroutines holding a slot, at most max
	max      int
	fill     int           // Config.GatherFill
	wait     time.Duration // Config.GatherWait
	sweeping bool          // a sweeper runs
	// waiting is set while a gathering goroutine waits for checks to
	// join the oldest queued one (Config.GatherWait); the check that
	// brings the queue to the fill sends a token on wake, under mu, and
	// clears it.
	waiting bool
	wake    chan struct{}
}

// gatherJob queues j, an opCheck job, and starts a gathering goroutine
// when none runs, or when fewer than the maximum run and Config.GatherFill
// checks are queued: with the store idle, j has a call of its own at once.
// With the fill queued it ends the wait of a goroutine waiting for checks
// (Config.GatherWait) instead. It starts the sweeper when none runs.
func (g *Guard) gatherJob(j *job) {
	q := &g.gather
	q.mu.Lock()
	q.queue = append(q.queue, j)
	sweep := !q.sweeping
	q.sweeping = true
	woke := q.waiting && len(q.queue) >= q.fill
	if woke {
		// Under mu, so that a waiter the timer woke takes the token back;
		// only one goroutine waits at a time, so the buffer is empty.
		q.waiting = false
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	gather := !woke && q.running < q.max && (q.running == 0 || len(q.queue) >= q.fill)
	if gather {
		q.running++
	}
	q.mu.Unlock()
	if sweep {
		go g.sweep()
	}
	if gather {
		go g.gatherLoop()
	}
}

// sweepEvery is how often the sweeper looks for gathered checks whose
// caller stops waiting: a caller waits at most this much past its
// deadline, plus scheduling delays.
func (g *Guard) sweepEvery() time.Duration {
	return min(max(g.deadline/8, 250*time.Microsecond), 5*time.Millisecond)
}

// sweep ends the wait of the callers of gathered checks whose deadline
// passed or whose context ended, until no check is queued or in flight.
// Their jobs are marked abandoned: a queued one is not sent, and each
// recycles itself when its call returns. One timer for all the waiting
// callers costs less than one per check.
func (g *Guard) sweep() {
	q := &g.gather
	t := time.NewTicker(g.sweepEvery())
	defer t.Stop()
	for now := range t.C {
		q.mu.Lock()
		if len(q.queue) == 0 && len(q.active) == 0 {
			q.sweeping = false
			q.mu.Unlock()
			return
		}
		g.giveUp(q.queue, now)
		for _, sc := range q.active {
			if g.giveUp(sc.batch, now) && !sc.yielded && (!now.Before(sc.expires) ||
				g.stall.stalled(sc.since, now, g.stall.timeout())) {
				// Past its deadline, or stalled, with none of its checks
				// waiting: the store call is stuck (a client
				// reconnecting, a paused server), and the queued checks
				// must not wait for it.
				g.yield(sc)
			}
		}
		q.mu.Unlock()
	}
}

// giveUp tells the callers of the jobs of js that are past their deadline,
// whose context ended, or whose store stalled, that they may stop
// waiting; nil entries (jobs handed back already) are skipped. It reports
// whether no caller is left waiting. The gatherer's mu is held.
func (g *Guard) giveUp(js []*job, now time.Time) (none bool) {
	none = true
	for _, j := range js {
		if j == nil || j.state.Load() != jobRunning {
			continue
		}
		stalled := g.stall.stalled(j.start, now, j.stall)
		if now.Before(j.expires) && !closed(j.gone) && !stalled {
			none = false
			continue
		}
		v := doneGaveUp
		switch sent := j.sent.Load(); {
		case stalled && sent:
			v = doneStalled
		case stalled:
			v = doneStalledUnsent
		case !sent:
			v = doneGaveUpUnsent
		}
		if j.state.CompareAndSwap(jobRunning, jobAbandoned) {
			j.done <- v
		}
	}
	return none
}

// closed reports whether c is closed; a nil c (a context that never ends)
// never is.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// gatherScratch is the scratch space of a gathering goroutine.
type gatherScratch struct {
	batch, live []*job
	reqs        []store.Request
	out         []sluice.Decision
	b           store.Batch // the store call, on reqs and out

	// For a store that reports parts (store.Info.Parts): the guard; for
	// each live job, its index in batch, the index of its first request
	// in reqs and the number of its requests not reported yet; the live
	// job of each request; the live jobs a part completed; onPart, bound
	// once; and the number of live jobs not handed back yet.
	g       *Guard
	pos     []int
	off     []int
	left    []int
	jobOf   []int32
	ready   []int
	part    func(idx []int, err error)
	waiting int
	// expires is the deadline of the store call, since its start on the
	// stall detector's awake clock, and yielded is set when the goroutine
	// gave its gathering slot up (see yield); all are set under the
	// gatherer's mu.
	expires time.Time
	since   int64
	yielded bool
	timer   *time.Timer // for await, made on its first wait
}

var gatherPool = sync.Pool{New: func() any { return new(gatherScratch) }}

// gatherLoop makes store calls of the queued checks until none is left
// (or too few for it, see Config.GatherFill). Its first call goes at once;
// the checks queued during a call wait, after it, for others to join them
// (Config.GatherWait).
func (g *Guard) gatherLoop() {
	q := &g.gather
	sc := gatherPool.Get().(*gatherScratch)
	sc.g = g
	if sc.part == nil {
		sc.part = sc.onPart // once per scratch: a method value allocates
	}
	called := false // a call was made: the checks queued came during it
	for {
		q.mu.Lock()
		// A goroutine leaves when nothing is queued, and when another
		// holds a slot and too few are queued for a second call (the other
		// takes them when its call returns).
		if len(q.queue) == 0 || sc.yielded || q.running > 1 && len(q.queue) < q.fill {
			if !sc.yielded { // else its slot was given up already
				q.running--
			}
			sc.yielded, sc.g = false, nil
			q.mu.Unlock()
			if cap(sc.batch) <= MaxGathered {
				gatherPool.Put(sc)
			}
			return
		}
		if called && q.wait > 0 && len(q.queue) < q.fill {
			// The store is busy: wait for others to go with the oldest
			// check (Config.GatherWait).
			if d := q.wait - time.Since(q.queue[0].queued); d > 0 {
				sc.await(q, d)
				continue
			}
		}
		n, k := 0, 0
		for k < len(q.queue) && (k == 0 || n+len(q.queue[k].reqs) <= MaxGathered) {
			n += len(q.queue[k].reqs)
			k++
		}
		sc.batch = append(sc.batch[:0], q.queue[:k]...)
		rest := copy(q.queue, q.queue[k:])
		clear(q.queue[rest:])
		q.queue = q.queue[:rest]
		now := time.Now()
		sc.expires, sc.since = now.Add(g.deadline), g.stall.clock(now)
		q.active = append(q.active, sc)
		// The jobs to send are chosen and marked sent under mu, where the
		// sweeper gives up on them: a job it reports not sent is never
		// sent, and one it finds sent is.
		sc.live, sc.pos = sc.live[:0], sc.pos[:0]
		for i, j := range sc.batch {
			if j.state.Load() != jobAbandoned {
				j.sent.Store(true)
				sc.live = append(sc.live, j)
				sc.pos = append(sc.pos, i)
			}
		}
		q.mu.Unlock()
		g.execGathered(sc)
		called = true
		clear(sc.batch) // the jobs are recycled
		clear(sc.live)
	}
}

// await waits d, or until gatherJob wakes it with the fill queued. The
// gatherer's mu is held on entry and released on return.
func (sc *gatherScratch) await(q *gatherer, d time.Duration) {
	q.waiting = true
	q.mu.Unlock()
	if sc.timer == nil {
		sc.timer = time.NewTimer(d)
	} else {
		sc.timer.Reset(d)
	}
	select {
	case <-sc.timer.C:
	case <-q.wake:
	}
	sc.timer.Stop()
	q.mu.Lock()
	if !q.waiting { // woken as the timer fired: take the token back
		select {
		case <-q.wake:
		default:
		}
	}
	q.waiting = false
	q.mu.Unlock()
}

// yield gives up the gathering slot of sc's goroutine, whose store call
// handed some of its checks back and still waits for a part (a master
// that does not answer, until the deadline), or is past its deadline with
// every check given up or handed back (a client that returns late, while
// it reconnects): the checks queued meanwhile get a call at once, from a
// new goroutine that takes the slot over, rather than waiting for that
// call. sc's goroutine ends when its call returns, its jobs still in
// flight until then (Config.MaxInFlight bounds the calls so left
// running). The gatherer's mu is held.
func (g *Guard) yield(sc *gatherScratch) {
	q := &g.gather
	sc.yielded = true
	if len(q.queue) == 0 {
		q.running--
		return
	}
	go g.gatherLoop() // takes the slot over
}

// execGathered decides the checks of sc.live, the jobs of sc.batch (an
// active batch) chosen to be sent, in one store call and hands each job
// of the batch back. A job whose caller gave up before the batch was taken
// is not in sc.live: its caller has answered already, so it must not be
// charged. The batch leaves the active ones before any of its jobs is
// handed back or recycled.
func (g *Guard) execGathered(sc *gatherScratch) {
	if len(sc.live) > 0 {
		g.stats.gatheredCalls.Add(1)
		g.stats.gatheredJobs.Add(int64(len(sc.live)))
		g.obs.Gathered(len(sc.live))
		ctx, cancel := context.WithDeadline(context.Background(), sc.expires)
		if len(sc.live) == 1 {
			g.exec(ctx, sc.live[0])
		} else {
			g.checkGathered(ctx, sc)
		}
		cancel()
	}
	q := &g.gather
	q.mu.Lock()
	for i, a := range q.active {
		if a == sc {
			last := len(q.active) - 1
			q.active[i], q.active[last] = q.active[last], nil
			q.active = q.active[:last]
			break
		}
	}
	q.mu.Unlock()
	for _, j := range sc.batch {
		if j != nil { // not handed back by onPart
			g.finish(j) // hands a live job back; recycles an abandoned one
		}
	}
}

// checkGathered decides the jobs of sc.live, several, in one store call.
func (g *Guard) checkGathered(ctx context.Context, sc *gatherScratch) {
	sc.reqs = sc.reqs[:0]
	for _, j := range sc.live {
		sc.reqs = append(sc.reqs, j.reqs...)
	}
	sc.out = grow(sc.out, len(sc.reqs))
	var err error
	if g.parts {
		err = g.checkParts(ctx, sc)
	} else {
		sent := time.Now()
		sc.b = store.Batch{Reqs: sc.reqs, Out: sc.out}
		err = g.inner.Do(ctx, &sc.b)
		sc.b = store.Batch{}
		g.noteAnswer(sent, err)
	}
	clear(sc.reqs) // drop the references to keys and params
	if g.parts && err == nil {
		return // every job was handed back by onPart
	}
	if err != nil && !errors.Is(err, sluice.ErrStoreUnavailable) {
		// One invalid request fails the whole call: decide each job on
		// its own, so that the error is only its own.
		for _, j := range sc.live {
			g.exec(ctx, j)
		}
		return
	}
	// A store that answered for some requests and not for others (a node
	// of a cluster down) fails only the jobs with a request it left out,
	// each as a whole.
	var partial *store.PartialError
	if err != nil {
		var pe *store.PartialError // its address escapes: only on an error
		if errors.As(err, &pe) {
			partial = pe
		}
		err = whole(err)
	}
	off, k := 0, 0
	for _, j := range sc.live {
		n := len(j.reqs)
		copy(j.out, sc.out[off:off+n])
		j.err = err
		if partial != nil {
			for k < len(partial.Failed) && partial.Failed[k] < off {
				k++
			}
			if k == len(partial.Failed) || partial.Failed[k] >= off+n {
				j.err = nil
			}
		}
		off += n
	}
}

// checkParts decides the jobs of sc.live with a store call that reports
// its parts as they end (store.Batch.Part: on a Redis Cluster, one part
// per master), and hands each job back (through onPart) as soon as its
// requests are reported, so that a master that does not answer holds up
// only the checks with a key on it.
// When it returns an error, no job was handed back.
func (g *Guard) checkParts(ctx context.Context, sc *gatherScratch) error {
	sc.off, sc.left = sc.off[:0], sc.left[:0]
	sc.jobOf = sc.jobOf[:0]
	off := 0
	for k, j := range sc.live {
		sc.off = append(sc.off, off)
		sc.left = append(sc.left, len(j.reqs))
		for range j.reqs {
			sc.jobOf = append(sc.jobOf, int32(k))
		}
		off += len(j.reqs)
	}
	sc.waiting = len(sc.live)
	sc.b = store.Batch{Reqs: sc.reqs, Out: sc.out, Part: sc.part}
	err := g.inner.Do(ctx, &sc.b)
	sc.b = store.Batch{}
	if err != nil {
		g.noteAnswer(sc.expires.Add(-g.deadline), err)
		return err
	}
	// A store that left requests unreported fails their jobs.
	sc.ready = sc.ready[:0]
	for k, n := range sc.left {
		if n > 0 {
			sc.left[k] = 0
			sc.live[k].err = fmt.Errorf("%w: the store did not decide the check", sluice.ErrStoreUnavailable)
			sc.ready = append(sc.ready, k)
		}
	}
	sc.handBack()
	return nil
}

// onPart takes a part reported by the store (store.Batch.Part): the requests
// idx of sc.reqs, decided or failed with err. It hands back the jobs
// whose requests are now all reported; a job with a failed request fails
// as a whole.
func (sc *gatherScratch) onPart(idx []int, err error) {
	sc.g.noteAnswer(sc.expires.Add(-sc.g.deadline), err)
	sc.ready = sc.ready[:0]
	for _, i := range idx {
		k := sc.jobOf[i]
		if err != nil && sc.live[k].err == nil {
			sc.live[k].err = err
		}
		if sc.left[k]--; sc.left[k] == 0 {
			sc.ready = append(sc.ready, int(k))
		}
	}
	sc.handBack()
}

// handBack hands the live jobs sc.ready back to their callers, with their
// decisions: it takes them out of their active batch first, under the
// gatherer's mu, as their callers may recycle them at once.
func (sc *gatherScratch) handBack() {
	if len(sc.ready) == 0 {
		return
	}
	q := &sc.g.gather
	q.mu.Lock()
	for _, k := range sc.ready {
		sc.batch[sc.pos[k]] = nil
	}
	q.mu.Unlock()
	for _, k := range sc.ready {
		j := sc.live[k]
		copy(j.out, sc.out[sc.off[k]:sc.off[k]+len(j.reqs)])
		sc.g.finish(j)
	}
	if sc.waiting -= len(sc.ready); sc.waiting > 0 {
		q.mu.Lock()
		if !sc.yielded {
			sc.g.yield(sc)
		}
		q.mu.Unlock()
	}
}
