package guard

import (
	"math"
	"runtime"
	"sync/atomic"
	"time"
)

// The heartbeat's period, and how late a beat may run before the
// lateness counts as time the process could not run.
const (
	beatEvery = 20 * time.Millisecond
	beatSlack = 20 * time.Millisecond
)

// heartbeat tells time the process could not run from time the store was
// silent. A process starved of CPU (a host loaded beyond its cores, a
// paused VM, a long collection), or with far more runnable goroutines than
// it can run, reads the store's answers late: the goroutine that reads the
// network waits for its turn, and the store looks silent while it answered
// long ago. While store calls are in flight, a goroutine of the guard beats
// every beatEvery and, once woken, yields (runtime.Gosched) so that it runs
// only when its turn comes among the runnable goroutines, as the network
// reader's does; how late it runs, beyond beatSlack, is time the process
// could not run. The stall detector counts the store's silence on the
// awake clock, which stands still for that time (see awake).
//
// Time is a parameter of next and awake, which tests call at fixed
// instants. It costs the check path one atomic load per store call (to
// see whether it beats) and one per clock reading. The zero value is
// idle; it is safe for concurrent use.
type heartbeat struct {
	inflight *atomic.Int64 // the guard's store calls in flight: it beats while > 0

	state   atomic.Pointer[beatState] // nil before the first beat
	running atomic.Bool               // a goroutine beats

	// hold, when set (by tests), is called by the beating goroutine
	// before each beat: a hold that blocks is a process that cannot run
	// its heartbeat.
	hold func()
}

// beatState is one immutable reading of the heartbeat, swapped whole so
// that a reader never sees a lateness counted twice or not at all.
type beatState struct {
	due     int64 // Unix ns at which the next beat is due; math.MaxInt64 when none is
	starved int64 // ns the beats ran late beyond beatSlack, summed
}

// awake returns the instant t, now or a moment ago, on the awake clock:
// Unix ns less the time the process could not run, the beat under way
// included. It stands still while a beat is late beyond the slack, and
// runs with the wall clock otherwise.
func (h *heartbeat) awake(t time.Time) int64 {
	n := t.UnixNano()
	st := h.state.Load()
	if st == nil {
		return n
	}
	return n - st.starved - max(n-st.due-int64(beatSlack), 0)
}

// start makes sure a goroutine beats while store calls are in flight; the
// caller has one in flight already.
func (h *heartbeat) start() {
	if h.running.Load() || !h.running.CompareAndSwap(false, true) {
		return
	}
	h.next(time.Now().UnixNano())
	go h.beat()
}

// next records a beat that ran at now (Unix ns), or the first one: the
// next is due one period later. The lateness of this beat beyond the slack
// joins the time the process could not run.
func (h *heartbeat) next(now int64) {
	var starved int64
	if st := h.state.Load(); st != nil {
		starved = st.starved + max(now-st.due-int64(beatSlack), 0)
	}
	h.state.Store(&beatState{due: now + int64(beatEvery), starved: starved})
}

// idle records that no beat is due: the time until the next start is
// not the process's.
func (h *heartbeat) idle() {
	var starved int64
	if st := h.state.Load(); st != nil {
		starved = st.starved
	}
	h.state.Store(&beatState{due: math.MaxInt64, starved: starved})
}

// beat beats until no store call is in flight.
func (h *heartbeat) beat() {
	t := time.NewTimer(beatEvery)
	defer t.Stop()
	for {
		<-t.C
		if h.hold != nil {
			h.hold()
		}
		// A goroutine woken by a timer runs next on its processor; one
		// woken by the network waits behind the runnable ones. Yield to
		// wait as it does.
		runtime.Gosched()
		h.next(time.Now().UnixNano())
		if h.inflight.Load() == 0 {
			h.idle()
			h.running.Store(false)
			// A call made meanwhile may have seen the goroutine running
			// and not started one: beat on for it, unless a new
			// goroutine took over.
			if h.inflight.Load() == 0 || !h.running.CompareAndSwap(false, true) {
				return
			}
			h.next(time.Now().UnixNano())
		}
		t.Reset(beatEvery)
	}
}
