package guard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

func newMemory(t testing.TB, now func() time.Time) *memory.Store {
	t.Helper()
	s, err := memory.New(memory.Config{MaxKeys: 1 << 12, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newGuard(t testing.TB, inner Store, cfg Config) *Guard {
	t.Helper()
	g, err := New(inner, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func params(t testing.TB, l sluice.Limit) *algorithm.Params {
	t.Helper()
	p, err := algorithm.Compile(l)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

func check1(ctx context.Context, g *Guard, key string, p *algorithm.Params, cost int64) (sluice.Decision, engine.Source, error) {
	reqs := []store.Request{{Key: key, Params: p, Cost: cost}}
	out := make([]sluice.Decision, 1)
	src := make([]engine.Source, 1)
	err := checkSourced(ctx, g, false, reqs, out, src)
	return out[0], src[0], err
}

// checkSourced decides reqs through g.Do, as one unit when all, and writes
// to src the engine's source of each decision.
func checkSourced(ctx context.Context, g *Guard, all bool, reqs []store.Request, out []sluice.Decision, src []engine.Source) error {
	ss := make([]store.Source, len(reqs))
	err := g.Do(ctx, &store.Batch{Reqs: reqs, Out: out, All: all, Sources: ss})
	for i, s := range ss {
		switch s {
		case store.SourceOverLimitCache:
			src[i] = engine.SourceOverLimitCache
		case store.SourceHotKey:
			src[i] = engine.SourceHotKey
		default:
			src[i] = engine.SourceStore
		}
	}
	return err
}

// TestDeadline runs in a testing/synctest bubble: the clock is fake, so
// the bounds are exact. A call gives up at the deadline (plus, for a
// gathered check, the sweeper's period), and a caller's shorter deadline
// wins.
func TestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		f.SetDelay(time.Second)
		const deadline = 5 * time.Millisecond
		p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Second})
		for _, gatherers := range []int{0, -1} {
			g := newGuard(t, f, Config{Deadline: deadline, Gatherers: gatherers, Breaker: BreakerConfig{Disabled: true}})
			for range 20 {
				start := time.Now()
				_, _, err := check1(context.Background(), g, "k", p, 1)
				if !errors.Is(err, sluice.ErrStoreUnavailable) {
					t.Fatalf("slow store: err = %v, want one wrapping ErrStoreUnavailable", err)
				}
				if took, most := time.Since(start), deadline+g.sweepEvery(); took < deadline || took > most {
					t.Fatalf("gatherers %d: check against a store that takes 1s returned after %s, want [%s, %s]", gatherers, took, deadline, most)
				}
			}
		}

		// A caller's shorter deadline wins.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		g2 := newGuard(t, f, Config{Deadline: time.Second, Gatherers: -1, Breaker: BreakerConfig{Disabled: true}})
		start := time.Now()
		if _, _, err := check1(ctx, g2, "k", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatalf("err = %v", err)
		}
		if took := time.Since(start); took != time.Millisecond {
			t.Errorf("caller's 1ms deadline: returned after %s", took)
		}
	})
}

// TestBreaker opens the breaker, sees it refuse calls without sending
// them, let a probe through after its open timeout, and close after
// successful probes. It runs in a testing/synctest bubble, where the
// breaker's clock is the bubble's: time passes only when the test sleeps.
func TestBreaker(t *testing.T) {
	synctest.Test(t, testBreaker)
}

func testBreaker(t *testing.T) {
	settle(t)
	const openTimeout = 100 * time.Millisecond
	f := &guardtest.Faulty{Inner: newMemory(t, nil)}
	var mu sync.Mutex
	var changes []string
	transitions := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), changes...)
	}
	obs := &countObserver{}
	g := newGuard(t, f, Config{
		Observer: obs,
		Deadline: time.Second,
		Breaker:  BreakerConfig{Window: time.Minute, MinRequests: 10, FailureRatio: 0.5, OpenTimeout: openTimeout, Probes: 2, Sustain: -1},
		OnBreakerChange: func(from, to BreakerState) {
			mu.Lock()
			changes = append(changes, from.String()+">"+to.String())
			mu.Unlock()
		},
	})
	p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Second})
	ctx := context.Background()
	// Healthy calls do not open it.
	for range 20 {
		if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
			t.Fatal(err)
		}
	}
	f.SetDown(true)
	// 20 successes, then failures: it opens once failures reach half of
	// the window's calls (at the 20th failure).
	for i := range 19 {
		check1(ctx, g, "k", p, 1)
		if g.BreakerState() != BreakerClosed {
			t.Fatalf("opened after %d failures of %d calls", i+1, 21+i)
		}
	}
	check1(ctx, g, "k", p, 1)
	if got := fmtList(transitions()); got != "[closed>open]" {
		t.Fatalf("after 20 failures in 40 calls: transitions %s, want [closed>open]", got)
	}
	// Open: calls fail at once and nothing reaches the store, until the
	// open timeout, however many calls come.
	calls := f.Calls()
	for range 100 {
		if _, _, err := check1(ctx, g, "k", p, 1); !errors.Is(err, ErrBreakerOpen) || !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatalf("open breaker: err = %v, want ErrBreakerOpen", err)
		}
	}
	time.Sleep(openTimeout - time.Millisecond)
	if _, _, err := check1(ctx, g, "k", p, 1); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("open breaker, 1ms before its timeout: err = %v, want ErrBreakerOpen", err)
	}
	if n := f.Calls() - calls; n != 0 {
		t.Errorf("open breaker: %d calls reached the store, want 0", n)
	}
	// After the timeout a probe goes through; it fails: open again.
	time.Sleep(2 * time.Millisecond)
	seen := len(transitions())
	if _, _, err := check1(ctx, g, "k", p, 1); errors.Is(err, ErrBreakerOpen) || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("probe: err = %v, want the store's failure", err)
	}
	if got := fmtList(transitions()[seen:]); got != "[open>half_open half_open>open]" || f.Calls()-calls != 1 {
		t.Fatalf("failed probe: transitions %s, %d store calls; want [open>half_open half_open>open], 1", got, f.Calls()-calls)
	}
	f.SetDown(false)
	time.Sleep(openTimeout + time.Millisecond)
	if got := g.BreakerState(); got != BreakerHalfOpen {
		t.Fatalf("after the open timeout: %s, want half_open", got)
	}
	for range 2 {
		if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	if got := g.BreakerState(); got != BreakerClosed {
		t.Fatalf("after 2 successful probes: %s, want closed", got)
	}
	want := "[closed>open open>half_open half_open>open open>half_open half_open>closed]"
	if got := fmtList(transitions()); got != want {
		t.Errorf("transitions %s, want %s", got, want)
	}
	st := g.Stats()
	if st.BreakerOpened != 2 || st.BreakerClosed != 1 || st.BreakerRefused != 101 {
		t.Errorf("stats %+v, want 2 opened, 1 closed, 101 refused", st)
	}
	if obs.breaker[BreakerOpen].Load() != 2 || obs.breaker[BreakerClosed].Load() != 1 || obs.calls.Load() != st.StoreCalls || obs.errs.Load() != st.StoreErrors {
		t.Errorf("observer: breaker %d open %d closed, %d calls %d errors; stats %+v", obs.breaker[BreakerOpen].Load(), obs.breaker[BreakerClosed].Load(), obs.calls.Load(), obs.errs.Load(), st)
	}
}

// countObserver counts the events it receives.
type countObserver struct {
	breaker                 [3]atomic.Int64
	calls, errs, olc, syncs atomic.Int64
	detected, hot, entries  atomic.Int64
}

func (o *countObserver) BreakerChanged(to BreakerState) { o.breaker[to].Add(1) }
func (o *countObserver) StoreCall(d time.Duration, err error) {
	o.calls.Add(1)
	if err != nil {
		o.errs.Add(1)
	}
}
func (o *countObserver) OverLimitCacheHit()                  { o.olc.Add(1) }
func (o *countObserver) OverLimitEntries(n int)              { o.entries.Store(int64(n)) }
func (o *countObserver) HotKeyDetected()                     { o.detected.Add(1) }
func (o *countObserver) HotKeys(n int)                       { o.hot.Store(int64(n)) }
func (o *countObserver) HotKeySync(lag time.Duration)        { o.syncs.Add(1) }
func (o *countObserver) HotKeySyncCall(time.Duration, error) {}
func (o *countObserver) Gathered(n int)                      {}

func fmtList(s []string) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out + "]"
}

// TestDeadlineWithAStoreThatIgnoresIt: a store that blocks past its
// context (as a client reconnecting may) still has its callers answered
// at the deadline, the calls left running are bounded by MaxInFlight, and
// their goroutines end when the store returns. The store blocks until the
// test releases it, so that each call's fate follows from the calls in
// flight before it, whatever the machine's speed: below the bound it is
// sent; at the bound, with none of the calls in flight able to end (each
// blocked in the store, or waiting for a gatherer that is), it is refused.
// Gathered checks whose callers gave up before a gatherer was free end
// unsent, and free their place early: those are the only ones.
func TestDeadlineWithAStoreThatIgnoresIt(t *testing.T) {
	for _, gatherers := range []int{0, -1} {
		t.Run(fmt.Sprintf("gatherers=%d", gatherers), func(t *testing.T) {
			const maxInFlight = 20
			s := &blockedStore{Store: newMemory(t, nil), release: make(chan struct{})}
			var releaseOnce sync.Once
			unblock := func() { releaseOnce.Do(func() { close(s.release) }) }
			defer unblock() // a failed test does not leave calls blocked
			g := newGuard(t, s, Config{Deadline: 5 * time.Millisecond, MaxInFlight: maxInFlight, Gatherers: gatherers, Breaker: BreakerConfig{Disabled: true}})
			p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Second})
			base := runtime.NumGoroutine()
			var worst time.Duration
			tooMany, stuckAtBound := 0, 0
			for i := range 100 {
				// The calls in flight only end, before the release, when
				// a gatherer is not blocked in the store (calls on
				// goroutines of their own all are), or when a gathered
				// check given up before it was sent is dropped. The
				// test's calls are the only ones: nothing adds to the
				// calls in flight during one.
				mayEnd := unsentGathered(g) // first: one may end meanwhile
				before := g.inflight.Load()
				stuck := (gatherers < 0 || s.calls.Load() >= DefaultGatherers) && before-mayEnd >= maxInFlight
				start := time.Now()
				_, _, err := check1(context.Background(), g, "k", p, 1)
				worst = max(worst, time.Since(start))
				if !errors.Is(err, sluice.ErrStoreUnavailable) {
					t.Fatalf("err = %v", err)
				}
				refused := errors.Is(err, ErrTooManyInFlight)
				if refused {
					tooMany++
				}
				switch {
				case before < maxInFlight && refused:
					t.Errorf("call %d refused for too many in flight with %d in flight (bound %d)", i, before, maxInFlight)
				case stuck:
					stuckAtBound++
					if !refused {
						t.Errorf("call %d sent with %d in flight, none of which could end (bound %d): %v", i, before, maxInFlight, err)
					}
				}
				if n := g.inflight.Load(); n > maxInFlight {
					t.Fatalf("%d calls in flight after call %d, bound %d", n, i, maxInFlight)
				}
			}
			if gatherers < 0 && tooMany != 100-maxInFlight {
				t.Errorf("%d of 100 calls refused for too many in flight, want %d (bound %d)", tooMany, 100-maxInFlight, maxInFlight)
			}
			if worst > 250*time.Millisecond {
				t.Errorf("worst wait %s against a store blocked past its context", worst)
			}
			if n := runtime.NumGoroutine(); n > base+maxInFlight+5 {
				t.Errorf("%d goroutines, %d before: more than MaxInFlight left running", n, base)
			}
			unblock()
			deadline := time.Now().Add(5 * time.Second)
			for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > base {
				t.Errorf("%d goroutines after the store returned, %d before", n, base)
			}
			t.Logf("worst wait %s, %d refused, %d of them with every call in flight stuck", worst, tooMany, stuckAtBound)
		})
	}
}

// unsentGathered returns the gathered checks that were not sent to the
// store: queued, or in a batch about to be called without them. Those
// given up end without a store call.
func unsentGathered(g *Guard) int64 {
	q := &g.gather
	q.mu.Lock()
	defer q.mu.Unlock()
	var n int64
	for _, j := range q.queue {
		if !j.sent.Load() {
			n++
		}
	}
	for _, sc := range q.active {
		for _, j := range sc.batch {
			if j != nil && !j.sent.Load() {
				n++
			}
		}
	}
	return n
}

// blockedStore is a store whose checks block, ignoring their context,
// until release is closed.
type blockedStore struct {
	Store
	calls   atomic.Int64 // checks begun
	release chan struct{}
}

func (b *blockedStore) Do(ctx context.Context, bt *store.Batch) error {
	if bt.All || bt.Once != nil {
		return b.Store.Do(ctx, bt)
	}
	b.calls.Add(1)
	<-b.release
	return b.Store.Do(ctx, bt)
}

// TestBreakerIgnoresCallerCancellation runs in a testing/synctest bubble:
// each caller cancels 1 ms into a call of a store that takes a second.
func TestBreakerIgnoresCallerCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		f.SetDelay(time.Second)
		g := newGuard(t, f, Config{Deadline: time.Second, Breaker: BreakerConfig{MinRequests: 2}})
		p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Second})
		for range 10 {
			ctx, cancel := context.WithCancel(context.Background())
			go func() { time.Sleep(time.Millisecond); cancel() }()
			if _, _, err := check1(ctx, g, "k", p, 1); !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled call: err = %v", err)
			}
			cancel()
		}
		if got := g.BreakerState(); got != BreakerClosed {
			t.Errorf("after calls cancelled by their callers: %s, want closed", got)
		}
	})
}

// TestBreakerIgnoresCallersShortDeadlines: callers whose own deadline is
// shorter than the store deadline give up on a store that answers within
// the store deadline. Their timeouts say nothing of the store: they must
// not open the breaker for every other caller. A store slower than the
// store deadline still opens it. It runs in a testing/synctest bubble.
func TestBreakerIgnoresCallersShortDeadlines(t *testing.T) {
	for _, gatherers := range []int{0, -1} {
		t.Run(fmt.Sprintf("gatherers=%d", gatherers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testBreakerIgnoresCallersShortDeadlines(t, gatherers) })
		})
	}
}

func testBreakerIgnoresCallersShortDeadlines(t *testing.T, gatherers int) {
	settle(t)
	f := &guardtest.Faulty{Inner: newMemory(t, nil)}
	g := newGuard(t, f, Config{Deadline: 50 * time.Millisecond, Gatherers: gatherers, OverLimit: OverLimitConfig{Disabled: true},
		Breaker: BreakerConfig{Window: time.Minute, MinRequests: 10, FailureRatio: 0.5, Sustain: -1}})
	p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1 << 30, Window: time.Second})
	f.SetDelay(10 * time.Millisecond)
	gaveUp := 0
	for range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		_, _, err := check1(ctx, g, "k", p, 1)
		cancel()
		if errors.Is(err, sluice.ErrStoreUnavailable) {
			gaveUp++
		}
	}
	if gaveUp != 30 {
		t.Fatalf("%d of 30 callers with 1ms deadlines gave up on a 10ms store, want all", gaveUp)
	}
	if st := g.BreakerState(); st != BreakerClosed {
		t.Fatalf("breaker %s after callers with 1ms deadlines gave up on a store answering in 10ms, within the 50ms store deadline; want closed", st)
	}
	if _, _, err := check1(context.Background(), g, "k", p, 1); err != nil {
		t.Fatalf("a caller with no deadline of its own: %v", err)
	}
	// The store slower than the store deadline: callers with no
	// deadline of their own wait for it, and their failures count.
	f.SetDelay(time.Second)
	for range 10 {
		check1(context.Background(), g, "k", p, 1)
	}
	if st := g.BreakerState(); st != BreakerOpen {
		t.Errorf("breaker %s after 10 calls past the store deadline, want open", st)
	}
}

// TestBreakerExcludedCallsDoNotDiluteTheRatio: calls cancelled by their
// callers are not counted, so they neither lower the failure ratio nor
// count toward MinRequests. 30 cancelled calls, then 20 failures: the 20
// counted calls all failed, and the breaker opens. It runs in a
// testing/synctest bubble.
func TestBreakerExcludedCallsDoNotDiluteTheRatio(t *testing.T) {
	synctest.Test(t, testBreakerExcludedCallsDoNotDiluteTheRatio)
}

func testBreakerExcludedCallsDoNotDiluteTheRatio(t *testing.T) {
	settle(t)
	f := &guardtest.Faulty{Inner: newMemory(t, nil)}
	g := newGuard(t, f, Config{Deadline: time.Second, OverLimit: OverLimitConfig{Disabled: true},
		Breaker: BreakerConfig{Window: time.Minute, MinRequests: 20, FailureRatio: 0.5, Sustain: -1}})
	p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1 << 30, Window: time.Second})
	f.SetDelay(time.Second)
	for range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(time.Millisecond); cancel() }()
		if _, _, err := check1(ctx, g, "k", p, 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: err = %v", err)
		}
		cancel()
	}
	f.SetDelay(0)
	f.SetDown(true)
	for i := range 20 {
		if st := g.BreakerState(); st != BreakerClosed {
			t.Fatalf("breaker %s after %d failures, want closed until 20", st, i)
		}
		check1(context.Background(), g, "k", p, 1)
	}
	if st := g.BreakerState(); st != BreakerOpen {
		t.Errorf("breaker %s after 30 cancelled calls and 20 failures, want open: the 20 counted calls all failed", st)
	}
}

// settle lets the goroutines a guard leaves behind in a testing/synctest
// bubble (calls past their deadline, the gatherer's sweeper) end before the
// bubble does, whether the test passes or fails: when the test ends, it
// sleeps a minute of the bubble's clock.
func settle(t *testing.T) { t.Cleanup(func() { time.Sleep(time.Minute) }) }

// fakeClock is a clock tests move by hand.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestOverLimitCacheIsExact runs random traffic through a guard and, in
// step, through a twin store with no guard: every decision's verdict must
// agree, for every algorithm, while the cache answers many of the guarded
// checks.
func TestOverLimitCacheIsExact(t *testing.T) {
	for _, alg := range sluice.Algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			clk := &fakeClock{}
			clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
			inner := &guardtest.Faulty{Inner: newMemory(t, clk.now)}
			twin := newMemory(t, clk.now)
			g := newGuard(t, inner, Config{Now: clk.now, Deadline: time.Second})
			p := params(t, sluice.Limit{Algorithm: alg, Limit: 10, Window: time.Second, Burst: 5})
			rng := rand.New(rand.NewPCG(1, uint64(alg)))
			hits := 0
			for i := range 5000 {
				key := []string{"a", "b", "c"}[rng.IntN(3)]
				cost := int64(1 + rng.IntN(3))
				d, src, err := check1(context.Background(), g, key, p, cost)
				if err != nil {
					t.Fatal(err)
				}
				want, err := twin.Decide(store.Request{Key: key, Params: p, Cost: cost})
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want.Allowed {
					t.Fatalf("check %d (%s cost %d, source %s): allowed %v, the store alone %v (%+v)", i, key, cost, src, d.Allowed, want.Allowed, want)
				}
				if src == engine.SourceOverLimitCache {
					hits++
					if d.RetryAfter <= 0 || d.RetryAfter > want.RetryAfter+time.Millisecond && want.RetryAfter > 0 {
						t.Fatalf("check %d: cached retry-after %s, store's %s", i, d.RetryAfter, want.RetryAfter)
					}
				}
				clk.advance(time.Duration(rng.IntN(40)) * time.Millisecond)
			}
			if hits == 0 {
				t.Errorf("the cache answered no check")
			}
			if got, want := g.Stats().OverLimitHits, int64(hits); got != want {
				t.Errorf("stats: %d hits, counted %d", got, want)
			}
			t.Logf("%d of 5000 checks answered by the over-limit cache", hits)
		})
	}
}

func TestOverLimitCache(t *testing.T) {
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	inner := &guardtest.Faulty{Inner: newMemory(t, clk.now)}
	g := newGuard(t, inner, Config{Now: clk.now, Deadline: time.Second})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Minute})
	ctx := context.Background()
	for range 3 {
		if d, _, _ := check1(ctx, g, "k", p, 1); !d.Allowed {
			t.Fatal("denied within the limit")
		}
	}
	d, src, _ := check1(ctx, g, "k", p, 1)
	if d.Allowed || src != engine.SourceStore || d.RetryAfter != time.Minute {
		t.Fatalf("4th: %+v from %s", d, src)
	}
	n := inner.Calls()
	for range 10 {
		clk.advance(time.Second)
		d, src, _ = check1(ctx, g, "k", p, 1)
		if d.Allowed || src != engine.SourceOverLimitCache {
			t.Fatalf("cached: %+v from %s", d, src)
		}
	}
	if d.RetryAfter != 50*time.Second || d.Limit != 3 {
		t.Errorf("cached decision %+v, want retry-after 50s", d)
	}
	if inner.Calls() != n {
		t.Errorf("the cache called the store %d times", inner.Calls()-n)
	}
	// Cost 0 (a read) always goes to the store.
	if _, src, _ := check1(ctx, g, "k", p, 0); src != engine.SourceStore {
		t.Errorf("read from %s", src)
	}
	// CheckAll with a cached key: denied, nothing consumed; the other key
	// is read (one store call, cost 0) and reports its true remaining.
	reqs := []store.Request{{Key: "other", Params: p, Cost: 1}, {Key: "k", Params: p, Cost: 1}}
	out := make([]sluice.Decision, 2)
	src2 := make([]engine.Source, 2)
	n = inner.Calls()
	if err := checkSourced(ctx, g, true, reqs, out, src2); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed || out[1].Allowed || out[0].RetryAfter != 0 || out[0].Remaining != 3 || out[1].RetryAfter == 0 || src2[1] != engine.SourceOverLimitCache || inner.Calls() != n+1 {
		t.Errorf("CheckAll with a cached key: %+v %v, %d store calls", out, src2, inner.Calls()-n)
	}
	if d, _, _ := check1(ctx, g, "other", p, 3); !d.Allowed {
		t.Errorf("the refused CheckAll consumed from the other key")
	}
	// Reset forgets.
	if err := g.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, src, _ := check1(ctx, g, "k", p, 1); !d.Allowed || src != engine.SourceStore {
		t.Errorf("after Reset: %+v from %s", d, src)
	}
	// At the retry-after the store decides again.
	check1(ctx, g, "k", p, 3)
	clk.advance(time.Minute)
	if d, src, _ := check1(ctx, g, "k", p, 1); !d.Allowed || src != engine.SourceStore {
		t.Errorf("after the window: %+v from %s", d, src)
	}
}

// TestOverLimitCacheKeepsLimitsApart: the priorities (and tiers and
// overrides) of a rule count on one key with different limits. A denial
// under one limit is remembered for that limit only: a check of the key
// under another limit goes to the store, which may admit it.
func TestOverLimitCacheKeepsLimitsApart(t *testing.T) {
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC).UnixNano())
	inner := &guardtest.Faulty{Inner: newMemory(t, clk.now)}
	twin := newMemory(t, clk.now)
	g := newGuard(t, inner, Config{Now: clk.now, Deadline: time.Second})
	low := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 8, Window: time.Minute})
	high := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 12, Window: time.Minute})
	ctx := context.Background()
	tests := []struct {
		p       *algorithm.Params
		src     engine.Source
		allowed bool
	}{
		{low, engine.SourceStore, true}, // 1 of 8
		{low, engine.SourceStore, true},
		{low, engine.SourceStore, true},
		{low, engine.SourceStore, true},
		{low, engine.SourceStore, true},
		{low, engine.SourceStore, true},
		{low, engine.SourceStore, true},
		{low, engine.SourceStore, true},            // 8 of 8
		{low, engine.SourceStore, false},           // remembered for low
		{low, engine.SourceOverLimitCache, false},  // answered for low
		{high, engine.SourceStore, true},           // 9 of 12: not low's denial
		{high, engine.SourceStore, true},           // 10
		{low, engine.SourceOverLimitCache, false},  // low's entry stands
		{high, engine.SourceStore, true},           // 11
		{high, engine.SourceStore, true},           // 12
		{high, engine.SourceStore, false},          // remembered for high
		{high, engine.SourceOverLimitCache, false}, // answered for high
		{low, engine.SourceStore, false},           // high's denial replaced low's
	}
	for i, tt := range tests {
		d, src, err := check1(ctx, g, "k", tt.p, 1)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := twin.Decide(store.Request{Key: "k", Params: tt.p, Cost: 1})
		if d.Allowed != tt.allowed || want.Allowed != tt.allowed || src != tt.src {
			t.Errorf("check %d (limit %d): allowed %v from %s (the store alone: %v), want %v from %s",
				i, tt.p.Limit, d.Allowed, src, want.Allowed, tt.allowed, tt.src)
		}
	}
}

// lateStore decides a Check at once but, when hold is set, returns its
// answer only once release is closed.
type lateStore struct {
	*memory.Store
	hold    atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *lateStore) Do(ctx context.Context, bt *store.Batch) error {
	if bt.All || bt.Once != nil {
		return s.Store.Do(ctx, bt)
	}
	err := s.Store.Do(ctx, bt)
	if s.hold.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return err
}

// TestOverLimitCacheResetWithCheckInFlight: a check decided before a reset
// through this instance brings back its denial after the reset. The denial
// is not remembered: the first check after the reset reaches the reset
// store and is admitted.
func TestOverLimitCacheResetWithCheckInFlight(t *testing.T) {
	s := &lateStore{Store: newMemory(t, nil), entered: make(chan struct{}), release: make(chan struct{})}
	g := newGuard(t, s, Config{Deadline: 5 * time.Second, Breaker: BreakerConfig{Disabled: true}})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour})
	ctx := context.Background()
	for range 3 {
		if d, _, err := check1(ctx, g, "k", p, 1); err != nil || !d.Allowed {
			t.Fatalf("within the limit: %+v %v", d, err)
		}
	}
	s.hold.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() {
		if d, _, _ := check1(ctx, g, "k", p, 1); d.Allowed {
			t.Error("4th check admitted")
		}
	})
	<-s.entered // denied by the store; the answer is held
	if err := g.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	close(s.release)
	wg.Wait()
	d, src, err := check1(ctx, g, "k", p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || src != engine.SourceStore {
		t.Errorf("first check after Reset: allowed %v from %s (retry after %s), want admitted by the store", d.Allowed, src, d.RetryAfter.Round(time.Second))
	}
}

// TestOverLimitCacheCoarseQuantum: a limit counted in quanta of a second
// reports a retry-after from the start of the current second, up to a
// second long. Denied half a second into its window, a check of 10 per
// second reports 1 s; the cache must not deny, from that figure, the
// checks of the next window, which the store admits.
func TestOverLimitCacheCoarseQuantum(t *testing.T) {
	p, err := algorithm.CompileAt(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Second}, 1_000_000)
	if err != nil || p.Quantum != 1_000_000 {
		t.Fatalf("CompileAt: quantum %d, %v", p.Quantum, err)
	}
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 500_000_000, time.UTC).UnixNano())
	g := newGuard(t, newMemory(t, clk.now), Config{Now: clk.now, Deadline: time.Second})
	for i := range 11 {
		d, _, err := check1(context.Background(), g, "k", &p, 1)
		if err != nil || d.Allowed != (i < 10) {
			t.Fatalf("check %d: %+v, %v", i, d, err)
		}
	}
	clk.advance(600 * time.Millisecond) // 0.1 s into the next window
	d, src, err := check1(context.Background(), g, "k", &p, 1)
	if err != nil || !d.Allowed || src != engine.SourceStore {
		t.Errorf("first check of the next window: allowed %v from %s, %v; want admitted by the store", d.Allowed, src, err)
	}
}

func TestOverLimitCacheBounded(t *testing.T) {
	// Bounds below, at and above the number of shards, and one that is
	// not a multiple of it.
	for _, bound := range []int{1, 10, 32, 64, 100} {
		t.Run(fmt.Sprint(bound), func(t *testing.T) {
			inner := newMemory(t, nil)
			g := newGuard(t, inner, Config{Deadline: time.Second, OverLimit: OverLimitConfig{MaxKeys: bound}})
			p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Minute})
			most := int64(0)
			for i := range 1000 {
				key := fmt.Sprintf("k%d", i)
				check1(context.Background(), g, key, p, 1)
				check1(context.Background(), g, key, p, 1)
				most = max(most, g.olc.n.Load())
			}
			held := 0
			for i := range g.olc.shards {
				held += len(g.olc.shards[i].m)
			}
			if most > int64(bound) || held > bound {
				t.Errorf("up to %d keys cached (%d at the end), bound %d", most, held, bound)
			}
			if held < bound*3/4 {
				t.Errorf("%d keys cached after 1000 denied keys, bound %d: the bound is not used", held, bound)
			}
		})
	}
}

// TestCachedKeysKeepOnlyThemselves: a request's key may be cut from a
// larger string (the engine writes the keys of a check into one). The
// over-limit cache and the hot-key tier copy the keys they keep, so that
// an entry keeps alive its key's bytes and not the string it was cut from:
// their bounds by count then bound their memory.
func TestCachedKeysKeepOnlyThemselves(t *testing.T) {
	// A detection window of an hour: no hot key cools down during the
	// test, however slow the machine.
	g := newGuard(t, newMemory(t, nil), Config{Deadline: time.Second, HotKeys: HotKeyConfig{Enabled: true, Window: time.Hour}})
	p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Hour})
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	const n, size = 16, 1 << 20
	before := heap()
	for i := range n {
		head := fmt.Sprintf("rl:r:fw.1h0m0s:{client=%d}", i)
		big := head + strings.Repeat(":", size)
		key := big[:len(head)]
		check1(context.Background(), g, key, p, 1) // admitted
		check1(context.Background(), g, key, p, 1) // denied, and remembered
		g.hot.promoteKey(&store.Request{Key: big[:len(head)+1], Params: p, Cost: 1})
	}
	if got := g.olc.n.Load(); got != n {
		t.Fatalf("%d keys in the over-limit cache, want %d", got, n)
	}
	if got := len(*g.hot.keys.Load()); got != n {
		t.Fatalf("%d hot keys, want %d", got, n)
	}
	if grown := heap() - before; grown > n*size/4 {
		t.Errorf("%d cached denials and %d hot keys of 30 bytes keep %d bytes alive, want far fewer than the %d of the strings they were cut from",
			n, n, grown, n*size)
	}
}

func TestBadConfig(t *testing.T) {
	inner := newMemory(t, nil)
	for _, c := range []Config{
		{Deadline: -1},
		{Breaker: BreakerConfig{FailureRatio: 2}},
		{Breaker: BreakerConfig{FailureRatio: math.NaN()}},
		{Breaker: BreakerConfig{FailureRatio: math.Inf(1)}},
		{OverLimit: OverLimitConfig{MaxKeys: -1}},
		{HotKeys: HotKeyConfig{Enabled: true, SyncInterval: time.Hour}},
		{HotKeys: HotKeyConfig{Enabled: true, Threshold: 1, Window: time.Second}},
	} {
		if g, err := New(inner, c); err == nil {
			g.Close()
			t.Errorf("New(%+v): no error", c)
		}
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New(nil): no error")
	}
}

// TestBreakerSustain: failures that meet the ratio for less than Sustain
// (a stall of the server) leave the breaker closed; failures that go on
// open it once Sustain has passed. It runs in a testing/synctest bubble:
// time passes only when the test sleeps, so the bounds are exact.
func TestBreakerSustain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		const sustain = 150 * time.Millisecond
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		g := newGuard(t, f, Config{Deadline: time.Second, OverLimit: OverLimitConfig{Disabled: true},
			Breaker: BreakerConfig{Window: time.Minute, MinRequests: 10, FailureRatio: 0.5, Sustain: sustain}})
		p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1 << 30, Window: time.Second})
		ctx := context.Background()
		// A short stall: 50 failures within 50 ms, then health.
		f.SetDown(true)
		for range 50 {
			check1(ctx, g, "k", p, 1)
			time.Sleep(time.Millisecond)
		}
		f.SetDown(false)
		for range 200 {
			if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
				t.Fatalf("healthy again: %v", err)
			}
		}
		if st := g.BreakerState(); st != BreakerClosed {
			t.Fatalf("breaker %s after a short burst of failures, want closed", st)
		}
		// An outage: failures go on, one a millisecond. The ratio is met
		// at the 150th (200 failures of 400 calls in the window), 149 ms
		// in, and the breaker opens at the first failure Sustain later.
		f.SetDown(true)
		start := time.Now()
		for g.BreakerState() == BreakerClosed && time.Since(start) < 5*time.Second {
			check1(ctx, g, "k", p, 1)
			time.Sleep(time.Millisecond)
		}
		met := 149 * time.Millisecond
		if took := time.Since(start); g.BreakerState() != BreakerOpen || took < met+sustain || took > met+sustain+time.Millisecond {
			t.Errorf("breaker %s %s into the outage, want open %s in", g.BreakerState(), took, met+sustain)
		}
	})
}
