package guard

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// hammer checks key with cost 1 from n goroutines for d, and returns the
// checks made and the instants (since start) of the admitted ones.
func hammer(t *testing.T, g *Guard, key string, p *algorithm.Params, n int, d time.Duration) (checks int64, admitted []time.Time, sources map[engine.Source]int64) {
	t.Helper()
	var mu sync.Mutex
	sources = map[engine.Source]int64{}
	var total atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			var local []time.Time
			src := map[engine.Source]int64{}
			for time.Now().Before(stop) {
				dec, s, err := check1(context.Background(), g, key, p, 1)
				if err != nil {
					t.Error(err)
					return
				}
				total.Add(1)
				src[s]++
				if dec.Allowed {
					local = append(local, time.Now())
				}
			}
			mu.Lock()
			admitted = append(admitted, local...)
			for k, v := range src {
				sources[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return total.Load(), admitted, sources
}

func hotConfig() Config {
	// A long deadline: the hammering goroutines saturate the machine, and
	// these tests are about the hot-key tier, not about deadlines.
	return Config{Deadline: time.Second, HotKeys: HotKeyConfig{Enabled: true, Threshold: 500, SyncInterval: 10 * time.Millisecond, Window: 100 * time.Millisecond}}
}

func TestHotKeyUnderLimit(t *testing.T) {
	inner := &guardtest.Faulty{Inner: newMemory(t, nil)}
	g := newGuard(t, inner, hotConfig())
	p := params(t, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 100_000_000, Window: time.Minute})
	checks, admitted, src := hammer(t, g, "hot", p, 4, time.Second)
	if int64(len(admitted)) != checks {
		t.Errorf("%d of %d checks denied far below the limit", checks-int64(len(admitted)), checks)
	}
	reached := inner.Requests()
	t.Logf("%d checks, %d requests reached the store (%.2f%%), sources %v", checks, reached, 100*float64(reached)/float64(checks), src)
	// Generous (the Redis test holds the tier to 90%): under -race on a
	// busy machine the sync goroutine may be starved for a while.
	if float64(reached) > 0.25*float64(checks) {
		t.Errorf("%d of %d checks reached the store, want at most 25%%", reached, checks)
	}
	if src[engine.SourceHotKey] == 0 {
		t.Errorf("no check was decided by the hot-key tier")
	}
	// TestHotKeyLeaseCycle sees the key cool down, on a fake clock.
}

// TestHotKeyOvershoot hammers keys far above their limits and counts what
// was admitted against what the limit allows.
func TestHotKeyOvershoot(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: hammers keys for seconds")
	}
	for _, tc := range []struct {
		limit sluice.Limit
	}{
		{sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 2000, Window: time.Second}},
		{sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 2000, Window: time.Second}},
		{sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 2000, Window: time.Second}},
		{sluice.Limit{Algorithm: sluice.GCRA, Limit: 2000, Window: time.Second}},
	} {
		t.Run(tc.limit.Algorithm.String(), func(t *testing.T) {
			inner := &guardtest.Faulty{Inner: newMemory(t, nil)}
			g := newGuard(t, inner, hotConfig())
			p := params(t, tc.limit)
			start := time.Now()
			checks, admitted, src := hammer(t, g, "hot", p, 4, 2500*time.Millisecond)
			elapsed := time.Since(start)
			reached := inner.Requests()
			// Fixed window: the most admitted in one window of the epoch,
			// against the limit. Every algorithm: everything admitted,
			// against the allowance of the run (the burst, plus the refill
			// over the run).
			allow := float64(tc.limit.Limit) * (1 + elapsed.Seconds())
			over := float64(len(admitted))/allow - 1
			if tc.limit.Algorithm == sluice.FixedWindow {
				worst := maxPerWindow(admitted, time.Second)
				over = float64(worst)/float64(tc.limit.Limit) - 1
			}
			t.Logf("%s: %d checks in %s, %d admitted, overshoot %.2f%%, store requests %d (%.2f%% of checks), sources %v",
				tc.limit.Algorithm, checks, elapsed.Round(time.Millisecond), len(admitted), 100*max(0, over), reached, 100*float64(reached)/float64(checks), src)
			if over > 0.05 {
				t.Errorf("overshoot %.2f%%, want at most 5%%", 100*over)
			}
			if float64(reached) > 0.25*float64(checks) {
				t.Errorf("%d of %d checks reached the store, want at most 25%%", reached, checks)
			}
		})
	}
}

// TestHotKeyLeaseServesItsOwnLimit: the priorities of a rule count on one
// key with different limits (480 at low priority, 720 at high here). A hot
// key's lease is taken under one of them and decides only the checks
// under the same limit: low-priority checks are not admitted from a lease
// taken at high priority once their own limit is used up, and a top-up
// refused at low priority denies no high-priority check.
func TestHotKeyLeaseServesItsOwnLimit(t *testing.T) {
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC).UnixNano())
	mem := newMemory(t, clk.now)
	g := newGuard(t, mem, Config{Now: clk.now, Deadline: 10 * time.Second, Breaker: BreakerConfig{Disabled: true},
		OverLimit: OverLimitConfig{Disabled: true},
		HotKeys:   HotKeyConfig{Enabled: true, SyncInterval: time.Second, Window: time.Second, Threshold: 4}})
	low := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 480, Window: time.Minute})
	high := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 720, Window: time.Minute})
	ctx := context.Background()
	// 500 units used: over the low-priority limit, under the high one.
	out := make([]sluice.Decision, 1)
	if err := mem.Check(ctx, []store.Request{{Key: "k", Params: high, Cost: 500}}, out); err != nil || !out[0].Allowed {
		t.Fatal(out[0], err)
	}
	check := func(p *algorithm.Params) (sluice.Decision, engine.Source) {
		t.Helper()
		d, src, err := check1(ctx, g, "k", p, 1)
		if err != nil {
			t.Fatal(err)
		}
		return d, src
	}
	lowAdmitted, highDenied, highLeased := 0, 0, 0
	for range 10 { // 110 high-priority units: 610 of 720
		check(high)
		g.sync(ctx, time.Second) // a lease under the last check's limit: high
		for range 10 {
			if d, _ := check(low); d.Allowed {
				lowAdmitted++
			}
			d, src := check(high)
			if !d.Allowed {
				highDenied++
			}
			if src == engine.SourceHotKey {
				highLeased++
			}
		}
	}
	if lowAdmitted > 0 || highDenied > 0 {
		t.Errorf("with 500 to 610 units used: %d low-priority checks admitted (limit 480), %d high-priority ones denied (limit 720)", lowAdmitted, highDenied)
	}
	if highLeased == 0 {
		t.Errorf("no high-priority check was decided from the lease")
	}
	// The high lease expires; one taken at low priority is refused.
	clk.advance(3 * time.Second)
	check(low)
	g.sync(ctx, time.Second)
	if d, _ := check(low); d.Allowed {
		t.Errorf("low-priority check admitted with 610 of 480 units used")
	}
	if d, src := check(high); !d.Allowed {
		t.Errorf("high-priority check with 610 of 720 units used: denied by %s after a low-priority top-up was refused", src)
	}
}

// holdStore holds, once armed, the first Check that carries key hold until
// release is closed.
type holdStore struct {
	*memory.Store
	hold    string
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *holdStore) Do(ctx context.Context, bt *store.Batch) error {
	if bt.All || bt.Once != nil {
		return s.Store.Do(ctx, bt)
	}
	reqs := bt.Reqs
	for _, r := range reqs {
		if r.Key == s.hold && s.armed.CompareAndSwap(true, false) {
			close(s.entered)
			<-s.release
		}
	}
	return s.Store.Do(ctx, bt)
}

// TestHotKeyGiveBackKeepsToItsLease: a CheckAll admitted one unit of a hot
// key from its lease, in one fixed window, and is refused by the store
// only after a sync has replaced the lease in the next window. The unit
// was counted in the first window: it is not given back to the new lease,
// and the key admits no more than its limit in the next window.
func TestHotKeyGiveBackKeepsToItsLease(t *testing.T) {
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 59, 0, time.UTC).UnixNano())
	s := &holdStore{Store: newMemory(t, clk.now), hold: "o", entered: make(chan struct{}), release: make(chan struct{})}
	g := newGuard(t, s, Config{Now: clk.now, Deadline: 10 * time.Second, Breaker: BreakerConfig{Disabled: true},
		OverLimit: OverLimitConfig{Disabled: true},
		HotKeys:   HotKeyConfig{Enabled: true, SyncInterval: time.Second, Window: time.Second, Threshold: 4}})
	const limit = 600
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: time.Minute})
	po := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Hour})
	ctx := context.Background()
	if d, _, _ := check1(ctx, g, "o", po, 1); !d.Allowed { // o's next check is denied
		t.Fatal("o denied within its limit")
	}
	for range 4 { // h is hot
		check1(ctx, g, "h", p, 1)
	}
	g.sync(ctx, time.Second) // a lease in the window ending at 00:01:00
	if _, src, _ := check1(ctx, g, "h", p, 1); src != engine.SourceHotKey {
		t.Fatalf("h decided by %s, want a lease", src)
	}
	checkAll := func() {
		reqs := []store.Request{{Key: "h", Params: p, Cost: 1}, {Key: "o", Params: po, Cost: 1}}
		out := make([]sluice.Decision, 2)
		src := make([]engine.Source, 2)
		if err := checkSourced(ctx, g, true, reqs, out, src); err != nil {
			t.Error(err)
		}
		if out[0].Allowed || out[1].Allowed || src[0] != engine.SourceHotKey {
			t.Errorf("CheckAll of h and o: %+v from %v, want both refused, h from its lease", out, src)
		}
	}
	avail := func() int64 {
		hk := (*g.hot.keys.Load())["h"]
		hk.mu.Lock()
		defer hk.mu.Unlock()
		return hk.avail
	}
	// Refused while the lease lasts: the unit goes back to it.
	before := avail()
	checkAll()
	if after := avail(); after != before {
		t.Errorf("lease of %d units before a refused CheckAll, %d after", before, after)
	}

	s.armed.Store(true)
	var wg sync.WaitGroup
	wg.Go(checkAll)
	<-s.entered                          // h's unit is taken; o waits in the store
	clk.advance(1500 * time.Millisecond) // 00:01:00.5
	g.sync(ctx, time.Second)             // a lease in the next window
	close(s.release)
	wg.Wait()

	admitted := admittedOf(t, ctx, g, "h", p, 2*limit)
	if admitted > limit {
		t.Errorf("fixed window of %d: %d checks admitted in one window", limit, admitted)
	}
}

// maxPerWindow returns the most instants of ts in one window of length w
// aligned on the Unix epoch.
func maxPerWindow(ts []time.Time, w time.Duration) int {
	n := map[int64]int{}
	best := 0
	for _, t := range ts {
		k := t.UnixNano() / int64(w)
		n[k]++
		best = max(best, n[k])
	}
	return best
}

// TestHotKeyTopUpAcrossWindowsStartsANewLease: a fixed window's lease is
// topped up by a call sent just before the window ends and decided by the
// store in the next window. The units left of the old lease were counted
// in the old window: they are not admitted in the new one, and the key
// admits no more than its limit there.
func TestHotKeyTopUpAcrossWindowsStartsANewLease(t *testing.T) {
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 59, 0, time.UTC).UnixNano())
	s := &holdStore{Store: newMemory(t, clk.now), hold: "h", entered: make(chan struct{}), release: make(chan struct{})}
	g := newGuard(t, s, Config{Now: clk.now, Deadline: 10 * time.Second, Breaker: BreakerConfig{Disabled: true},
		OverLimit: OverLimitConfig{Disabled: true},
		HotKeys:   HotKeyConfig{Enabled: true, SyncInterval: time.Second, Window: time.Second, Threshold: 4}})
	const limit = 600
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: time.Minute})
	ctx := context.Background()
	for range 4 { // h is hot
		check1(ctx, g, "h", p, 1)
	}
	g.sync(ctx, time.Second) // a lease in the window ending at 00:01:00
	for range 3 {
		if _, src, _ := check1(ctx, g, "h", p, 1); src != engine.SourceHotKey {
			t.Fatalf("h decided by %s, want its lease", src)
		}
	}
	hk := (*g.hot.keys.Load())["h"]
	hk.mu.Lock()
	left := hk.avail
	hk.mu.Unlock()
	if left == 0 {
		t.Fatal("the lease is used up: nothing to carry over")
	}

	clk.advance(500 * time.Millisecond) // 00:00:59.5: the lease still runs
	s.armed.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() { g.sync(ctx, time.Second) })
	<-s.entered              // the top-up is sent in the first window
	clk.advance(time.Second) // 00:01:00.5
	close(s.release)         // and decided in the next one
	wg.Wait()

	admitted := admittedOf(t, ctx, g, "h", p, 2*limit)
	if admitted > limit {
		t.Errorf("fixed window of %d: %d checks admitted in the window after a top-up sent before it (%d units of the old lease left)", limit, admitted, left)
	}
}

// TestHotKeySyncWithOneNodeDown: a hot key's lease is topped up by a sync
// that batches every hot key, on a cluster one call per node. With one
// master down, the sync fails in part: the leases of the keys on the
// other masters were charged by Redis, and must be admitted, not lost at
// every sync (which would charge a live key for checks it never
// admitted, and deny its clients early).
//
// The guard's clock stands still and the test makes the syncs itself, so
// no lease expires: on a busy machine, callers held up longer than a
// lease's life (2 sync intervals) lost leases for reasons of their own.
func TestHotKeySyncWithOneNodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{NodeTimeout: 30 * time.Second})
	rs, err := redis.New(redis.Config{Addrs: c.Addrs(), DialTimeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	// A fixed window of an hour (on Redis' clock), far above the traffic:
	// every unit charged is admitted, but for the last lease's leftover.
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1_000_000, Window: time.Hour})
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 10*time.Second {
		time.Sleep(left + 100*time.Millisecond) // keep the run in one window
	}
	dead := c.Masters[0]
	var live, doomed string
	for i := 0; live == "" || doomed == ""; i++ {
		key := fmt.Sprintf("rl:hot:{user=%d}:x", i)
		onDead := onMaster(t, rs, dead, key, p)
		if onDead && doomed == "" {
			doomed = key
		} else if !onDead && live == "" {
			live = key
		}
	}
	clk := &fakeClock{}
	clk.ns.Store(time.Now().UnixNano())
	g := newGuard(t, rs, Config{Now: clk.now, Deadline: time.Second, Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true},
		HotKeys: HotKeyConfig{Enabled: true, Threshold: 4, SyncInterval: time.Second, Window: time.Second}})
	ctx := context.Background()
	admitted, hot := 0, 0
	// round checks the live key n times and the doomed one 4 times (hot
	// from the first round, and kept hot), then tops up their leases.
	round := func(n int) {
		for range n {
			d, src, err := check1(ctx, g, live, p, 1)
			if err != nil {
				t.Fatalf("live key: %v", err)
			}
			if d.Allowed {
				admitted++
				if src == engine.SourceHotKey {
					hot++
				}
			}
		}
		for range 4 {
			check1(ctx, g, doomed, p, 1)
		}
		g.sync(ctx, time.Second)
	}
	round(100)
	if n := g.Stats().HotKeys; n < 2 {
		t.Fatalf("%d hot keys, want both", n)
	}
	dead.Kill()
	syncErrors := g.Stats().SyncErrors
	for range 10 {
		round(100)
	}
	if g.Stats().SyncErrors == syncErrors {
		t.Fatal("no sync failed with a master down")
	}
	out := make([]sluice.Decision, 1)
	if err := rs.Check(ctx, []store.Request{{Key: live, Params: p, Cost: 0}}, out); err != nil {
		t.Fatal(err)
	}
	charged := p.Limit - out[0].Remaining - 1 // the first check above
	lost := charged - int64(admitted)
	hk := (*g.hot.keys.Load())[live]
	hk.mu.Lock()
	leftover := hk.avail
	hk.mu.Unlock()
	t.Logf("live hot key: %d charged by Redis, %d admitted (%d from its lease), %d never admitted, %d of them left in its lease", charged, admitted, hot, lost, leftover)
	if lost != leftover {
		t.Errorf("live hot key: %d units charged by Redis and never admitted, want only the %d left in its lease", lost, leftover)
	}
}

// admittedOf makes n checks of cost 1 of key and returns how many were
// admitted.
func admittedOf(t *testing.T, ctx context.Context, g *Guard, key string, p *algorithm.Params, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		d, _, err := check1(ctx, g, key, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}
