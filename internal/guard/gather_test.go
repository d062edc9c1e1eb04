package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// gateStore holds its first Check until open is closed, so that the
// checks that arrive meanwhile queue in the guard and are gathered. It
// states no capabilities of the store it wraps (see Info).
type gateStore struct {
	Store
	open  chan struct{}
	first atomic.Bool
	sizes chan int // the number of requests of every Check
}

func (s *gateStore) Do(ctx context.Context, bt *store.Batch) error {
	if bt.All || bt.Once != nil {
		return s.Store.Do(ctx, bt)
	}
	reqs := bt.Reqs
	if s.first.CompareAndSwap(false, true) {
		<-s.open
	}
	s.sizes <- len(reqs)
	return s.Store.Do(ctx, bt)
}

// gated returns a gateStore on a memory store and a guard around it with
// a 10 s deadline, that many gatherers, and no breaker or over-limit cache.
func gated(t *testing.T, gatherers int) (*gateStore, *Guard) {
	s := &gateStore{Store: newMemory(t, nil), open: make(chan struct{}), sizes: make(chan int, 100)}
	return s, newGuard(t, s, Config{Deadline: 10 * time.Second, Gatherers: gatherers,
		Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true}})
}

// Info states nothing of the wrapped store: no parts, one node, no
// records, so that a gathered call on a Redis Cluster is one call whose
// failed nodes come back as a *store.PartialError (gatePartsStore has the
// parts).
func (s *gateStore) Info() store.Info { return store.Info{} }

// TestGatheredChecksOneNodeDown gathers checks of keys on every master of
// a Redis Cluster into one store call, one master killed meanwhile: the
// checks of the others are decided by the store, and only those of the
// dead master fail, each as a whole.
func TestGatheredChecksOneNodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	// A long node timeout: the other masters serve their slots throughout.
	c := redistest.StartCluster(t, redistest.ClusterOptions{NodeTimeout: 30 * time.Second})
	rs := newClusterStore(t, c)
	s := &gateStore{Store: rs, open: make(chan struct{}), sizes: make(chan int, 100)}
	g := newGuard(t, s, Config{Deadline: 10 * time.Second, Gatherers: 1,
		Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true}})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})

	// Every key once, straight to the store, so that the master to kill
	// shows which keys it holds.
	const n = 30
	keys := make([]string, n)
	onDead := make([]bool, n)
	dead := c.Masters[0]
	for i := range keys {
		keys[i] = fmt.Sprintf("rl:gather:{user=%d}:x", i)
		if err := rs.Check(context.Background(), []store.Request{{Key: keys[i], Params: p, Cost: 1}}, make([]sluice.Decision, 1)); err != nil {
			t.Fatal(err)
		}
		slot, err := dead.Do("CLUSTER", "KEYSLOT", keys[i])
		if err != nil {
			t.Fatal(err)
		}
		held, err := dead.Do("CLUSTER", "COUNTKEYSINSLOT", slot)
		if err != nil {
			t.Fatal(err)
		}
		onDead[i] = held != "0"
	}

	var wg sync.WaitGroup
	wg.Go(func() { check1(context.Background(), g, "rl:gather:{held}:x", p, 1) })
	for g.Stats().GatheredCalls == 0 {
		time.Sleep(time.Millisecond)
	}
	errs := make([]error, n)
	decided := make([]sluice.Decision, n)
	for i, key := range keys {
		wg.Go(func() { decided[i], _, errs[i] = check1(context.Background(), g, key, p, 1) })
	}
	for queued(g) < n {
		time.Sleep(time.Millisecond)
	}
	dead.Kill()
	close(s.open)
	wg.Wait()

	live := 0
	for i := range n {
		switch {
		case onDead[i] && !errors.Is(errs[i], sluice.ErrStoreUnavailable):
			t.Errorf("check %d, on the killed master: %+v, %v; want an error", i, decided[i], errs[i])
		case onDead[i] && errors.As(errs[i], new(*store.PartialError)):
			// Its indexes would be those of the gathered call.
			t.Errorf("check %d, on the killed master: %v; want the failure of the whole check, not a partial one", i, errs[i])
		case !onDead[i] && (errs[i] != nil || !decided[i].Allowed || decided[i].Remaining != 8):
			t.Errorf("check %d, on a live master: %+v, %v; want allowed by the store, 8 remaining", i, decided[i], errs[i])
		case !onDead[i]:
			live++
		}
	}
	if live == 0 || live == n {
		t.Fatalf("%d of %d checks on live masters", live, n)
	}
}

// TestGatheredChecks sends 30 concurrent checks of one key with a limit
// of 10 while the store holds the first: the others are decided together
// in later calls, exactly 10 are admitted, and one invalid check among
// them fails alone.
func TestGatheredChecks(t *testing.T) {
	s, g := gated(t, 1)
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})

	var admitted, denied, invalid atomic.Int64
	var wg sync.WaitGroup
	run := func(cost int64) {
		d, _, err := check1(context.Background(), g, "k", p, cost)
		switch {
		case errors.Is(err, sluice.ErrInvalidCost):
			invalid.Add(1)
		case err != nil:
			t.Error(err)
		case d.Allowed:
			admitted.Add(1)
		default:
			denied.Add(1)
		}
	}
	wg.Go(func() { run(1) }) // held by the store
	for g.Stats().GatheredCalls == 0 {
		time.Sleep(time.Millisecond)
	}
	for i := range 30 {
		cost := int64(1)
		if i == 7 {
			cost = -1
		}
		wg.Go(func() { run(cost) })
	}
	// Let the 30 queue behind the held call, then open it.
	deadline := time.Now().Add(5 * time.Second)
	for queued(g) < 30 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(s.open)
	wg.Wait()
	close(s.sizes)

	if admitted.Load() != 10 || denied.Load() != 20 || invalid.Load() != 1 {
		t.Errorf("admitted %d denied %d invalid %d, want 10, 20 and 1", admitted.Load(), denied.Load(), invalid.Load())
	}
	largest := 0
	for n := range s.sizes {
		largest = max(largest, n)
	}
	if largest < 29 {
		t.Errorf("largest store call decided %d checks, want the 29 valid queued ones at once", largest)
	}
	st := g.Stats()
	if st.GatheredJobs != 31 || st.GatheredCalls < 2 {
		t.Errorf("gathered %d checks in %d calls, want 31 in at least 2", st.GatheredJobs, st.GatheredCalls)
	}
}

// queued returns the number of checks waiting for a gathered call.
func queued(g *Guard) int {
	g.gather.mu.Lock()
	defer g.gather.mu.Unlock()
	return len(g.gather.queue)
}

// TestGatheredCheckAbandoned: a check whose caller gave up while it was
// queued (its own deadline passed, before the store deadline of the call
// it waits behind) is not sent to the store, so it charges nothing.
func TestGatheredCheckAbandoned(t *testing.T) {
	s, g := gated(t, 1)
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})
	var wg sync.WaitGroup
	wg.Go(func() { check1(context.Background(), g, "held", p, 1) })
	for g.Stats().GatheredCalls == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := check1(ctx, g, "late", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("queued behind a held call past its own deadline: err = %v", err)
	}
	close(s.open)
	wg.Wait()
	// Give the gatherer time to see the abandoned check.
	time.Sleep(50 * time.Millisecond)
	out := make([]sluice.Decision, 1)
	if err := s.Store.Do(context.Background(), &store.Batch{Reqs: []store.Request{{Key: "late", Params: p, Cost: 0}}, Out: out}); err != nil {
		t.Fatal(err)
	}
	if out[0].Remaining != 10 {
		t.Errorf("remaining of the abandoned check's key = %d, want 10 (not charged)", out[0].Remaining)
	}
}

// TestCheckOfAGoneCallerIsNotSent: a check whose caller gave up before it
// even reached the guard (its context cancelled, or its deadline passed)
// is not sent, so it charges nothing, and it says nothing of the store to
// the breaker; with gathering and with a call per check alike.
func TestCheckOfAGoneCallerIsNotSent(t *testing.T) {
	for _, gatherers := range []int{0, -1} {
		t.Run(fmt.Sprintf("gatherers=%d", gatherers), func(t *testing.T) {
			f := &guardtest.Faulty{Inner: newMemory(t, nil)}
			g := newGuard(t, f, Config{Deadline: time.Second, Gatherers: gatherers, OverLimit: OverLimitConfig{Disabled: true},
				Breaker: BreakerConfig{Window: time.Minute, MinRequests: 5, FailureRatio: 0.5, Sustain: -1}})
			p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1000, Window: time.Hour})
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
			defer cancel2()
			for i := range 50 {
				ctx := cancelled
				if i%2 == 1 {
					ctx = expired
				}
				if _, _, err := check1(ctx, g, "k", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) || !errors.Is(err, ctx.Err()) {
					t.Fatalf("check %d of a gone caller: err = %v, want one wrapping ErrStoreUnavailable and %v", i, err, ctx.Err())
				}
			}
			time.Sleep(20 * time.Millisecond) // calls left running, if any, return
			if n := f.Requests(); n != 0 {
				t.Errorf("%d checks of gone callers reached the store, want none", n)
			}
			if st := g.BreakerState(); st != BreakerClosed {
				t.Errorf("breaker %s after 50 checks of gone callers, want closed", st)
			}
		})
	}
}

// TestQueuedTimeoutsKeepBreakerClosed: checks whose deadline passes while
// they wait behind a held call are answered as unavailable, but do not
// count against the store for the breaker.
func TestQueuedTimeoutsKeepBreakerClosed(t *testing.T) {
	s := &gateStore{Store: newMemory(t, nil), open: make(chan struct{}), sizes: make(chan int, 100)}
	g := newGuard(t, s, Config{Deadline: 5 * time.Millisecond, Gatherers: 1,
		Breaker:   BreakerConfig{MinRequests: 5, FailureRatio: 0.5, Window: time.Minute, Sustain: -1},
		OverLimit: OverLimitConfig{Disabled: true}})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1000, Window: time.Hour})
	// The held check's caller waits past the deadline, so that its call
	// keeps the gathering slot.
	held := queueJob(g, "held", p, time.Now().Add(time.Hour))
	for g.Stats().GatheredCalls == 0 {
		time.Sleep(time.Millisecond)
	}
	for i := range 50 {
		if _, _, err := check1(context.Background(), g, "queued", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatalf("check %d queued behind a held call: err = %v", i, err)
		}
	}
	if st := g.BreakerState(); st != BreakerClosed {
		t.Errorf("breaker %s after 50 checks timed out in the queue, want closed", st)
	}
	close(s.open)
	<-held
}

// queueJob queues a check of key for a gathered call, as run does, with
// no context: its caller waits until expires, or until the call returns.
// It returns the job's done channel.
func queueJob(g *Guard, key string, p *algorithm.Params, expires time.Time) chan uint8 {
	j := g.newJob(opCheck, []store.Request{{Key: key, Params: p, Cost: 1}}, 1)
	g.inflight.Add(1)
	j.gone, j.expires = nil, expires
	g.gatherJob(j)
	return j.done
}

// seenStore holds its first Check until open is closed and records the
// key of every request that reaches it.
type seenStore struct {
	*memory.Store
	open  chan struct{}
	first atomic.Bool
	mu    sync.Mutex
	seen  map[string]bool
}

func (s *seenStore) Do(ctx context.Context, bt *store.Batch) error {
	if bt.All || bt.Once != nil {
		return s.Store.Do(ctx, bt)
	}
	reqs := bt.Reqs
	if s.first.CompareAndSwap(false, true) {
		<-s.open
	}
	s.mu.Lock()
	for _, r := range reqs {
		s.seen[r.Key] = true
	}
	s.mu.Unlock()
	return s.Store.Do(ctx, bt)
}

// TestGatheredCheckReportedUnsentIsNotSent: the sweeper gives up on
// gathered checks while a gathering goroutine takes them into a call. A
// check whose caller is told it was not sent (excluded from the breaker,
// charging nothing) must not reach the store. Each round queues a full
// batch behind a held call and releases the call around the instant the
// batch's deadline passes, so that the sweeper and the gatherer meet; the
// rounds stop after a few seconds.
func TestGatheredCheckReportedUnsentIsNotSent(t *testing.T) {
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1 << 30, Window: time.Hour})
	unsent, charged := 0, 0
	stop := time.Now().Add(3 * time.Second)
	for round := 0; time.Now().Before(stop) && charged == 0; round++ {
		s := &seenStore{Store: newMemory(t, nil), open: make(chan struct{}), seen: map[string]bool{}}
		g, err := New(s, Config{Deadline: 2 * time.Millisecond, Gatherers: 1,
			Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		// Queue the jobs directly, with no context, so that only their
		// expiry ends their wait. The first, which the store holds, never
		// expires.
		held := queueJob(g, "held", p, time.Now().Add(time.Hour))
		for !s.first.Load() {
			time.Sleep(50 * time.Microsecond)
		}
		expires := time.Now().Add(time.Millisecond)
		keys := make([]string, MaxGathered)
		dones := make([]chan uint8, MaxGathered)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%d-%d", round, i)
			dones[i] = queueJob(g, keys[i], p, expires)
		}
		time.Sleep(time.Until(expires) + time.Duration(round%16)*25*time.Microsecond - 200*time.Microsecond)
		close(s.open)
		got := make([]uint8, len(dones))
		for i, done := range dones {
			got[i] = <-done
		}
		if v := <-held; v != doneFinished {
			t.Fatalf("round %d: the held check was given up (%d)", round, v)
		}
		for g.inflight.Load() != 0 { // the batch's call returns
			time.Sleep(100 * time.Microsecond)
		}
		s.mu.Lock()
		for i, v := range got {
			if v != doneGaveUpUnsent {
				continue
			}
			unsent++
			if s.seen[keys[i]] {
				charged++
				if charged == 1 {
					t.Errorf("round %d: check %q reported to its caller as not sent, but the store decided it", round, keys[i])
				}
			}
		}
		s.mu.Unlock()
		g.Close()
	}
	t.Logf("%d checks reported not sent, %d of them decided by the store", unsent, charged)
}

// gatePartsStore is a Redis store that holds its first call until open is
// closed, so that the checks that arrive meanwhile queue in the guard and
// are gathered; it reports the parts of a gathered call as the store
// does (store.Batch.Part).
type gatePartsStore struct {
	*redis.Store
	open  chan struct{}
	first atomic.Bool
}

func (s *gatePartsStore) hold() {
	if s.first.CompareAndSwap(false, true) {
		<-s.open
	}
}

func (s *gatePartsStore) Do(ctx context.Context, bt *store.Batch) error {
	if !bt.All && bt.Once == nil {
		s.hold()
	}
	return s.Store.Do(ctx, bt)
}

// TestGatheredChecksOneNodeStopped gathers checks of keys on every master
// of a Redis Cluster into one store call while one master is stopped
// (SIGSTOP: it accepts connections and answers nothing, as a host that
// froze or dropped off the network). The checks of the live masters are
// answered by the store as soon as their masters answer, before the
// stopped master's checks fail at the deadline; so are checks made
// meanwhile, which must not queue behind the call that waits for the
// stopped master. The stopped master's checks fail at the deadline.
func TestGatheredChecksOneNodeStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{NodeTimeout: 30 * time.Second})
	rs := newClusterStore(t, c)
	s := &gatePartsStore{Store: rs, open: make(chan struct{})}
	// A deadline long enough for a busy machine: the live masters answer
	// well within it, and the stopped master's checks fail at it.
	const deadline = time.Second
	g := newGuard(t, s, Config{Deadline: deadline, Gatherers: 1,
		Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true}})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})

	const n = 30
	keys := make([]string, n)
	onDead := make([]bool, n)
	dead := c.Masters[0]
	// Keys of live masters: the first for the call the store holds, the
	// others for the checks made meanwhile.
	var live []string
	for i := 0; i < n || len(live) < 11; i++ {
		key := fmt.Sprintf("rl:stopped:{user=%d}:x", i)
		onKill := onMaster(t, rs, dead, key, p)
		if i < n {
			keys[i], onDead[i] = key, onKill
		} else if !onKill {
			live = append(live, key)
		}
	}

	var wg sync.WaitGroup
	held := live[0]
	live = live[1:]
	wg.Go(func() { check1(context.Background(), g, held, p, 1) })
	for g.Stats().GatheredCalls == 0 {
		time.Sleep(time.Millisecond)
	}
	errs := make([]error, n)
	decided := make([]sluice.Decision, n)
	answered := make([]time.Time, n)
	for i, key := range keys {
		wg.Go(func() {
			decided[i], _, errs[i] = check1(context.Background(), g, key, p, 1)
			answered[i] = time.Now()
		})
	}
	for queued(g) < n {
		time.Sleep(time.Millisecond)
	}
	if err := dead.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Process().Signal(syscall.SIGCONT) })
	stopped := time.Now()
	close(s.open)

	// Checks of live keys made while the gathered call waits for the
	// stopped master: each has a call of its own, at once.
	laterErrs := make([]error, len(live))
	var laterDone time.Time
	for {
		if n := g.Stats().GatheredCalls; n >= 2 {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	for i, key := range live {
		_, _, laterErrs[i] = check1(context.Background(), g, key, p, 1)
	}
	laterDone = time.Now()
	wg.Wait()

	var lastLive, firstDead time.Time
	var deadWaits []time.Duration
	for i := range n {
		switch {
		case onDead[i] && !errors.Is(errs[i], sluice.ErrStoreUnavailable):
			t.Errorf("check %d, on the stopped master: %+v, %v; want an error", i, decided[i], errs[i])
		case !onDead[i] && (errs[i] != nil || !decided[i].Allowed || decided[i].Remaining != 8):
			t.Errorf("check %d, on a live master: %+v, %v; want allowed by the store, 8 remaining", i, decided[i], errs[i])
		}
		if onDead[i] {
			deadWaits = append(deadWaits, answered[i].Sub(stopped))
			if firstDead.IsZero() || answered[i].Before(firstDead) {
				firstDead = answered[i]
			}
		} else if answered[i].After(lastLive) {
			lastLive = answered[i]
		}
	}
	if len(deadWaits) == 0 || len(deadWaits) == n {
		t.Fatalf("%d of %d checks on the stopped master", len(deadWaits), n)
	}
	if !lastLive.Before(firstDead) {
		t.Errorf("the last live master's check was answered %s after the first check of the stopped master: it waited for the stopped master", lastLive.Sub(firstDead))
	}
	for i, err := range laterErrs {
		if err != nil {
			t.Errorf("later check %d, on a live master: %v", i, err)
		}
	}
	if !laterDone.Before(firstDead) {
		t.Errorf("checks made while the gathered call waited for the stopped master ended %s after its first check failed: they queued behind it", laterDone.Sub(firstDead))
	}
	slices.Sort(deadWaits)
	t.Logf("live checks answered %s after the master stopped; stopped master's checks failed after %s to %s (deadline %s)",
		lastLive.Sub(stopped), deadWaits[0], deadWaits[len(deadWaits)-1], deadline)
	if worst := deadWaits[len(deadWaits)-1]; worst > deadline+time.Second {
		t.Errorf("a check on the stopped master failed after %s, want about the deadline of %s", worst, deadline)
	}
}

// newClusterStore returns a Redis store on cluster c, closed with the test.
func newClusterStore(t *testing.T, c *redistest.Cluster) *redis.Store {
	t.Helper()
	rs, err := redis.New(redis.Config{Addrs: c.Addrs(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return rs
}

// onMaster checks key once, straight to rs, and reports whether master m
// of the cluster holds it.
func onMaster(t *testing.T, rs *redis.Store, m *redistest.Server, key string, p *algorithm.Params) bool {
	t.Helper()
	slot, err := m.Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		t.Fatal(err)
	}
	before, err := m.Do("CLUSTER", "COUNTKEYSINSLOT", slot)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Check(context.Background(), []store.Request{{Key: key, Params: p, Cost: 1}}, make([]sluice.Decision, 1)); err != nil {
		t.Fatal(err)
	}
	after, err := m.Do("CLUSTER", "COUNTKEYSINSLOT", slot)
	if err != nil {
		t.Fatal(err)
	}
	return after != before
}

// slowReturnStore is a Redis store that holds its first call until open is
// closed, and whose calls with a key of late return only once release is
// closed, whatever their context: as the Redis client does while it
// reconnects to a master that does not answer (up to its dial timeout).
type slowReturnStore struct {
	*redis.Store
	late    map[string]bool
	open    chan struct{}
	first   atomic.Bool
	release chan struct{}
	held    atomic.Int32 // calls begun that return late
}

// begin holds the first call until open is closed, and reports whether
// a call of reqs returns late.
func (s *slowReturnStore) begin(reqs []store.Request) bool {
	if s.first.CompareAndSwap(false, true) {
		<-s.open
	}
	for _, r := range reqs {
		if s.late[r.Key] {
			s.held.Add(1)
			return true
		}
	}
	return false
}

func (s *slowReturnStore) Do(ctx context.Context, bt *store.Batch) error {
	if bt.All || bt.Once != nil {
		return s.Store.Do(ctx, bt)
	}
	late := s.begin(bt.Reqs)
	err := s.Store.Do(ctx, bt)
	if late {
		<-s.release
	}
	return err
}

// TestGatheredCallsPastTheirDeadline: with both gathering slots held by
// store calls of checks on a stopped master (SIGSTOP), calls that return
// long past their deadline, one of a single check and one of several, the
// checks of the live masters made once the stopped master's checks have
// failed are decided by the store, not left to queue behind those calls
// until their own deadline. The calls left running end when the store
// returns, and their checks are recycled.
func TestGatheredCallsPastTheirDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{NodeTimeout: 30 * time.Second})
	rs := newClusterStore(t, c)
	s := &slowReturnStore{Store: rs, late: map[string]bool{}, open: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(s.release) }) }
	defer release() // a failed test does not leave calls held
	// A deadline long enough for a busy machine: the checks queued behind
	// the first call are taken into one call before it.
	const deadline = time.Second
	// A fill of 1: the second slot takes a call of one check.
	g := newGuard(t, s, Config{Deadline: deadline, Gatherers: 2, GatherFill: 1,
		Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true}})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})

	// Keys of the live masters, and keys of one slot of the stopped
	// master: a call of several of them waits for one part.
	dead := c.Masters[0]
	var tag string
	var live []string
	for i := 0; tag == "" || len(live) < 6; i++ {
		key := fmt.Sprintf("rl:past:{user=%d}:x", i)
		switch {
		case !onMaster(t, rs, dead, key, p):
			live = append(live, key)
		case tag == "":
			tag = fmt.Sprintf("{user=%d}", i)
		}
	}
	late := make([]string, 5)
	for i := range late {
		late[i] = fmt.Sprintf("rl:past:%s:%d", tag, i)
		s.late[late[i]] = true
	}
	if err := dead.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Process().Signal(syscall.SIGCONT) })

	// The first slot: a call held until open is closed. The second: a
	// call of one late check. Then four late checks queue, and the first
	// slot takes them into one call once open is closed.
	var wg sync.WaitGroup
	wg.Go(func() { check1(context.Background(), g, live[0], p, 1) })
	for g.Stats().GatheredCalls < 1 {
		time.Sleep(time.Millisecond)
	}
	lateErrs := make([]error, len(late))
	wg.Go(func() { _, _, lateErrs[0] = check1(context.Background(), g, late[0], p, 1) })
	for s.held.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	for i := 1; i < len(late); i++ {
		wg.Go(func() { _, _, lateErrs[i] = check1(context.Background(), g, late[i], p, 1) })
	}
	for queued(g) < len(late)-1 {
		time.Sleep(time.Millisecond)
	}
	close(s.open)
	wg.Wait()
	for i, err := range lateErrs {
		if !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Errorf("late check %d, on the stopped master: %v, want an error", i, err)
		}
	}
	if n := s.held.Load(); n != 2 {
		t.Fatalf("%d calls of late checks, want 2 (one of one check, one of %d)", n, len(late)-1)
	}

	// Both slots are held by calls past their deadline, all of whose
	// checks failed: checks of the live masters get calls of their own.
	live = live[1:]
	errs := make([]error, len(live))
	decided := make([]sluice.Decision, len(live))
	for i, key := range live {
		wg.Go(func() { decided[i], _, errs[i] = check1(context.Background(), g, key, p, 1) })
	}
	wg.Wait()
	for i := range live {
		if errs[i] != nil || !decided[i].Allowed || decided[i].Remaining != 8 {
			t.Errorf("check %d, on a live master: %+v, %v; want allowed by the store, 8 remaining", i, decided[i], errs[i])
		}
	}
	if n := s.held.Load(); n != 2 {
		t.Errorf("%d calls of late checks after the live checks, want 2", n)
	}

	// The held calls return: their goroutines end, and every check of
	// theirs leaves the calls in flight.
	release()
	for end := time.Now().Add(10 * time.Second); g.inflight.Load() != 0 || gathering(g) != 0; {
		if time.Now().After(end) {
			t.Fatalf("%d checks in flight, %d gathering goroutines holding a slot, 10s after the store returned", g.inflight.Load(), gathering(g))
		}
		time.Sleep(time.Millisecond)
	}
}

// gathering returns the number of gathering goroutines holding a slot.
func gathering(g *Guard) int {
	g.gather.mu.Lock()
	defer g.gather.mu.Unlock()
	return g.gather.running
}

// TestGatherWait: with Config.GatherWait, a check that finds the store
// idle has a call at once; the checks queued during a call wait, after
// it, until the oldest has waited that long, and those that come
// meanwhile join them in one call; the wait ends sooner with
// Config.GatherFill checks queued. A wait out of range (or above half the
// deadline) is refused.
func TestGatherWait(t *testing.T) {
	const wait = MaxGatherWait
	s := &gateStore{Store: newMemory(t, nil), open: make(chan struct{}), sizes: make(chan int, 100)}
	g := newGuard(t, s, Config{Deadline: 10 * time.Second, Gatherers: 1, GatherFill: 6, GatherWait: wait,
		Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true}})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})
	var wg sync.WaitGroup
	run := func(i int) {
		if _, _, err := check1(context.Background(), g, "k"+strconv.Itoa(i), p, 1); err != nil {
			t.Error(err)
		}
	}
	next := func() int {
		select {
		case n := <-s.sizes:
			return n
		case <-time.After(5 * time.Second):
			t.Fatal("no store call")
			return 0
		}
	}

	wg.Go(func() { run(0) }) // the store idle: a call at once, held by the gate
	for g.Stats().GatheredCalls == 0 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now() // before the oldest check that waits is queued
	for i := 1; i <= 3; i++ {
		wg.Go(func() { run(i) })
	}
	for queued(g) < 3 {
		time.Sleep(100 * time.Microsecond)
	}
	close(s.open)
	wg.Go(func() { run(4) }) // after the call, within the wait
	if n := next(); n != 1 {
		t.Errorf("a first call of %d checks, want 1", n)
	}
	n := next()
	if took := time.Since(start); took < wait {
		t.Errorf("the checks queued during the call went after %s, want them to wait %s", took, wait)
	}
	if n != 4 {
		t.Errorf("a second call of %d checks, want the 3 queued during the first and the one after", n)
	}

	// The fill ends the wait: 6 checks, 5 of them during a call.
	s.first.Store(false)
	s.open = make(chan struct{})
	wg.Go(func() { run(10) })
	for g.Stats().GatheredCalls < 3 {
		time.Sleep(time.Millisecond)
	}
	start = time.Now()
	for i := 11; i <= 14; i++ {
		wg.Go(func() { run(i) })
	}
	for queued(g) < 4 {
		time.Sleep(100 * time.Microsecond)
	}
	close(s.open)
	if n := next(); n != 1 {
		t.Errorf("a call of %d checks, want 1", n)
	}
	wg.Go(func() { run(15) })
	wg.Go(func() { run(16) })
	n = next()
	if took := time.Since(start); n != 6 || took >= wait {
		t.Errorf("a call of %d checks after %s, want the fill of 6 sent before the wait of %s ends", n, took, wait)
	}
	wg.Wait()

	// Alone on an idle store, a check does not wait.
	fastest := time.Hour
	for i := range 5 {
		start := time.Now()
		run(20 + i)
		fastest = min(fastest, time.Since(start))
		next()
	}
	if fastest >= wait/2 {
		t.Errorf("a check alone on an idle store took %s at best, want no wait", fastest)
	}

	for _, c := range []Config{{GatherWait: -time.Millisecond}, {GatherWait: MaxGatherWait + 1},
		{GatherWait: 3 * time.Millisecond, Deadline: 5 * time.Millisecond}} {
		if _, err := New(newMemory(t, nil), c); err == nil {
			t.Errorf("gather wait %s, deadline %s: no error", c.GatherWait, c.Deadline)
		}
	}
}

// TestGatherFill: while a gathered call is in flight, the checks that
// arrive wait for it until DefaultGatherFill are queued; then a second call
// takes them at once; a fill out of range is refused.
func TestGatherFill(t *testing.T) {
	s, g := gated(t, 2)
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Hour})
	var wg sync.WaitGroup
	run := func(i int) {
		if _, _, err := check1(context.Background(), g, "k"+strconv.Itoa(i), p, 1); err != nil {
			t.Error(err)
		}
	}
	wg.Go(func() { run(0) }) // held by the store
	for g.Stats().GatheredCalls == 0 {
		time.Sleep(time.Millisecond)
	}
	for i := 1; i < DefaultGatherFill; i++ {
		wg.Go(func() { run(i) })
	}
	for queued(g) < DefaultGatherFill-1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a second call would have started
	if n, calls := queued(g), g.Stats().GatheredCalls; n != DefaultGatherFill-1 || calls != 1 {
		t.Errorf("%d checks queued, %d calls, want %d queued behind the one call", n, calls, DefaultGatherFill-1)
	}
	wg.Go(func() { run(DefaultGatherFill) })
	select {
	case n := <-s.sizes:
		if n != DefaultGatherFill {
			t.Errorf("a second call of %d checks, want %d", n, DefaultGatherFill)
		}
	case <-time.After(5 * time.Second):
		t.Error("no second call with the fill queued")
	}
	close(s.open)
	wg.Wait()
	if st := g.Stats(); st.GatheredJobs != DefaultGatherFill+1 || st.GatheredCalls != 2 {
		t.Errorf("gathered %d checks in %d calls, want %d in 2", st.GatheredJobs, st.GatheredCalls, DefaultGatherFill+1)
	}
	for _, fill := range []int{-1, MaxGathered + 1} {
		if _, err := New(newMemory(t, nil), Config{GatherFill: fill}); err == nil {
			t.Errorf("gather fill %d: no error", fill)
		}
	}
}
