package memory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

// t0 is the instant most tests start at.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func compile(t testing.TB, l sluice.Limit) *algorithm.Params {
	t.Helper()
	p, err := algorithm.Compile(l)
	if err != nil {
		t.Fatalf("Compile(%+v): %v", l, err)
	}
	return &p
}

func decide(t testing.TB, s *Store, key string, p *algorithm.Params, cost int64, at time.Time) sluice.Decision {
	t.Helper()
	d, err := s.Decide(store.Request{Key: key, Params: p, Cost: cost, Now: at})
	if err != nil {
		t.Fatalf("Decide(%q, cost %d): %v", key, cost, err)
	}
	return d
}

// remaining reads the remaining units of key without consuming any.
func remaining(t testing.TB, s *Store, key string, p *algorithm.Params, at time.Time) int64 {
	t.Helper()
	return decide(t, s, key, p, 0, at).Remaining
}

// limitsUnderTest has one limit per algorithm, 50 per minute.
func limitsUnderTest() []sluice.Limit {
	var ls []sluice.Limit
	for _, a := range sluice.Algorithms {
		ls = append(ls, sluice.Limit{Algorithm: a, Limit: 50, Window: time.Minute})
	}
	return ls
}

// TestMatchesAlgorithm checks that the store decides a random sequence of
// requests on a few keys exactly as the pure functions do.
func TestMatchesAlgorithm(t *testing.T) {
	for _, l := range limitsUnderTest() {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			p := compile(t, l)
			s := newStore(t, Config{MaxKeys: 100})
			m := storetest.NewModel()
			rng := rand.New(rand.NewPCG(7, uint64(l.Algorithm)))
			at := t0
			for i := range 5000 {
				at = at.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
				r := store.Request{Key: fmt.Sprintf("k%d", rng.IntN(5)), Params: p, Cost: int64(rng.IntN(4)), Now: at}
				want := m.Decide(r)
				got := decide(t, s, r.Key, p, r.Cost, at)
				if got != want {
					t.Fatalf("request %d (%s cost %d at +%s): got %+v, want %+v", i, r.Key, r.Cost, at.Sub(t0), got, want)
				}
			}
		})
	}
}

// TestConcurrentOneKey checks that many goroutines checking one key at one
// frozen instant admit exactly what the algorithm admits.
func TestConcurrentOneKey(t *testing.T) {
	const goroutines, each = 8, 40
	for _, l := range limitsUnderTest() {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			p := compile(t, l)
			// What the algorithm admits of goroutines x each requests at t0.
			m := storetest.NewModel()
			var want int64
			for range goroutines * each {
				if m.Decide(store.Request{Key: "k", Params: p, Cost: 1, Now: t0}).Allowed {
					want++
				}
			}
			s := newStore(t, Config{Now: func() time.Time { return t0 }})
			var got atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					reqs := []store.Request{{Key: "k", Params: p, Cost: 1}} // zero Now: the frozen clock
					out := make([]sluice.Decision, 1)
					for i := range each {
						var err error
						if (g+i)%2 == 0 {
							out[0], err = s.Decide(reqs[0])
						} else {
							err = s.Check(context.Background(), reqs, out)
						}
						if err != nil {
							t.Error(err)
							return
						}
						if out[0].Allowed {
							got.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if got.Load() != want {
				t.Errorf("admitted %d of %d, want %d", got.Load(), goroutines*each, want)
			}
			if want != l.Limit {
				t.Errorf("the algorithm admits %d at one instant, want the limit %d", want, l.Limit)
			}
		})
	}
}

// TestConcurrentCheckAll races all-or-nothing batches over two keys with
// single checks of one of them: a batch never consumes one key without the
// other.
func TestConcurrentCheckAll(t *testing.T) {
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Hour})
	s := newStore(t, Config{Now: func() time.Time { return t0 }})
	var batches, singles atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := []store.Request{{Key: "a", Params: p, Cost: 1}, {Key: "b", Params: p, Cost: 1}}
			out := make([]sluice.Decision, 2)
			for range 60 {
				if g%2 == 0 {
					if err := s.CheckAll(context.Background(), reqs, out); err != nil {
						t.Error(err)
						return
					}
					if out[0].Allowed != out[1].Allowed {
						t.Errorf("batch half allowed: %+v", out)
					}
					if out[0].Allowed {
						batches.Add(1)
					}
				} else if err := s.Check(context.Background(), reqs[1:], out[1:]); err != nil {
					t.Error(err)
					return
				} else if out[1].Allowed {
					singles.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := remaining(t, s, "a", p, t0); got != 100-batches.Load() {
		t.Errorf("a: remaining %d, want %d (100 - %d batches)", got, 100-batches.Load(), batches.Load())
	}
	if got := batches.Load() + singles.Load(); got != 100 {
		t.Errorf("b: admitted %d, want 100", got)
	}
}

func TestMaxKeysBound(t *testing.T) {
	for _, max := range []int{1, 10, 1000} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			p := compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Hour})
			s := newStore(t, Config{MaxKeys: max})
			for i := range 10 * max {
				decide(t, s, fmt.Sprintf("key-%d", i), p, 1, t0)
			}
			if got := s.Len(); got != max {
				t.Errorf("Len() = %d after %d keys, want the cap %d", got, 10*max, max)
			}
		})
	}
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})
	s := newStore(t, Config{MaxKeys: 4, Shards: 1})
	for _, k := range []string{"a", "b", "c", "d"} {
		decide(t, s, k, p, 1, t0)
	}
	decide(t, s, "a", p, 1, t0) // a is now the most recently used; b the least
	decide(t, s, "e", p, 1, t0) // evicts b
	decide(t, s, "c", p, 0, t0) // a read is a use too: d is now the least
	decide(t, s, "f", p, 1, t0) // evicts d
	for _, tc := range []struct {
		key  string
		want int64
	}{{"a", 8}, {"c", 9}, {"e", 9}, {"f", 9}} {
		if got := remaining(t, s, tc.key, p, t0); got != tc.want {
			t.Errorf("%s: remaining %d, want %d", tc.key, got, tc.want)
		}
	}
	// b and d were forgotten: they read as new keys (a read inserts nothing).
	for _, k := range []string{"b", "d"} {
		if got := remaining(t, s, k, p, t0); got != 10 {
			t.Errorf("%s: remaining %d, want 10 (evicted)", k, got)
		}
	}
	if got := s.Len(); got != 4 {
		t.Errorf("Len() = %d, want 4", got)
	}
}

func TestReclaimsExpiredState(t *testing.T) {
	for _, l := range limitsUnderTest() {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			p := compile(t, l)
			s := newStore(t, Config{MaxKeys: 1000, Shards: 1})
			for i := range 100 {
				decide(t, s, fmt.Sprintf("old-%d", i), p, 1, t0)
			}
			later := t0.Add(time.Hour) // every old key's limit is restored
			for i := range 100 {
				decide(t, s, fmt.Sprintf("new-%d", i), p, 1, later)
			}
			if got := s.Len(); got != 100 {
				t.Errorf("Len() = %d, want 100: the expired keys reclaimed", got)
			}
			sh := &s.shards[0]
			if sh.used > 101 {
				t.Errorf("arena handed out %d slots for 100 live keys: expired slots not reused", sh.used)
			}
			if l.Algorithm == sluice.SlidingWindowLog && len(sh.logs) != 100 {
				t.Errorf("%d logs kept, want 100", len(sh.logs))
			}
		})
	}
}

// TestAfterKeepsLiveState checks that requests decided an hour ahead
// (After) do not reclaim keys whose limits are restored only then: a
// store sweeps by the instant of a request, not by the instant it is
// decided at.
func TestAfterKeepsLiveState(t *testing.T) {
	for _, l := range limitsUnderTest() {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			p := compile(t, l)
			s := newStore(t, Config{MaxKeys: 1000, Shards: 1})
			for i := range 100 {
				decide(t, s, fmt.Sprintf("old-%d", i), p, 50, t0)
			}
			for i := range 100 {
				r := store.Request{Key: fmt.Sprintf("new-%d", i), Params: p, Cost: 1, Now: t0, After: time.Hour}
				if _, err := s.Decide(r); err != nil {
					t.Fatal(err)
				}
			}
			if got := s.Len(); got != 200 {
				t.Errorf("Len() = %d, want 200: no live key reclaimed", got)
			}
			if d := decide(t, s, "old-0", p, 1, t0); d.Allowed {
				t.Errorf("old-0 at t0: got %+v, want denied", d)
			}
		})
	}
}

// TestKeepsStateSharedByPriorities checks that a key decided with several
// Params sharing its state (a rule's priority variants) is not reclaimed
// while any of them still sees it as used: 9 units at normal priority and
// one at high take 1 s to restore at the normal refill, and the key must
// not be swept at the 0.83 s of the high one.
func TestKeepsStateSharedByPriorities(t *testing.T) {
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			ps := []algorithm.Params{
				*compile(t, sluice.Limit{Algorithm: a, Limit: 8, Window: time.Second}),
				*compile(t, sluice.Limit{Algorithm: a, Limit: 10, Window: time.Second}),
				*compile(t, sluice.Limit{Algorithm: a, Limit: 12, Window: time.Second}),
			}
			algorithm.ShareState(ps)
			normal, high := &ps[1], &ps[2]
			s := newStore(t, Config{MaxKeys: 8, Shards: 1})
			decide(t, s, "k", normal, 9, t0)
			decide(t, s, "k", high, 1, t0)
			later := t0.Add(900 * time.Millisecond)
			decide(t, s, "other", normal, 1, later) // an insertion sweeps the expired tail

			// What the algorithm decides on the state kept.
			m := storetest.NewModel()
			m.Decide(store.Request{Key: "k", Params: normal, Cost: 9, Now: t0})
			m.Decide(store.Request{Key: "k", Params: high, Cost: 1, Now: t0})
			want := m.Decide(store.Request{Key: "k", Params: normal, Cost: 10, Now: later})
			if got := decide(t, s, "k", normal, 10, later); got != want {
				t.Errorf("normal priority, cost 10 at +900ms: got %+v, want %+v", got, want)
			}
		})
	}
}

func TestCheckAll(t *testing.T) {
	p := compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 5, Window: time.Hour})
	s := newStore(t, Config{})
	ctx := context.Background()
	decide(t, s, "a", p, 4, t0) // a has 1 left

	out := make([]sluice.Decision, 2)
	reqs := []store.Request{{Key: "a", Params: p, Cost: 2, Now: t0}, {Key: "b", Params: p, Cost: 1, Now: t0}}
	if err := s.CheckAll(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed || out[1].Allowed {
		t.Errorf("a batch with a denied request: allowed %v, %v, want false, false", out[0].Allowed, out[1].Allowed)
	}
	if out[0].Reason != sluice.ReasonLimited || out[1].Reason != sluice.ReasonLimited {
		t.Errorf("reasons %s, %s, want limited, limited", out[0].Reason, out[1].Reason)
	}
	if out[1].Remaining != 5 || out[1].RetryAfter != 0 {
		t.Errorf("b in a denied batch: remaining %d, retry after %s, want 5, 0", out[1].Remaining, out[1].RetryAfter)
	}
	if got := remaining(t, s, "a", p, t0); got != 1 {
		t.Errorf("a after a denied batch: remaining %d, want 1", got)
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len() = %d after a denied batch, want 1 (b not created)", got)
	}

	reqs[0].Cost = 1
	if err := s.CheckAll(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || !out[1].Allowed {
		t.Errorf("an admissible batch: allowed %v, %v, want true, true", out[0].Allowed, out[1].Allowed)
	}
	if got, got2 := remaining(t, s, "a", p, t0), remaining(t, s, "b", p, t0); got != 0 || got2 != 4 {
		t.Errorf("after an admitted batch: remaining a %d, b %d, want 0, 4", got, got2)
	}

	// The same key twice sees its own update.
	for _, tc := range []struct {
		costs   [2]int64
		allowed bool
		left    int64
	}{
		{[2]int64{3, 3}, false, 5},
		{[2]int64{2, 3}, true, 0},
	} {
		key := fmt.Sprintf("c%v", tc.costs)
		twice := []store.Request{{Key: key, Params: p, Cost: tc.costs[0], Now: t0}, {Key: key, Params: p, Cost: tc.costs[1], Now: t0}}
		if err := s.CheckAll(ctx, twice, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed != tc.allowed || out[1].Allowed != tc.allowed {
			t.Errorf("costs %v on one key: allowed %v, %v, want %v", tc.costs, out[0].Allowed, out[1].Allowed, tc.allowed)
		}
		if got := remaining(t, s, key, p, t0); got != tc.left {
			t.Errorf("costs %v on one key: remaining %d, want %d", tc.costs, got, tc.left)
		}
	}
}

func TestCheckAllManyKeysAndLog(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Config{MaxKeys: 1000, Shards: 8})
	var reqs []store.Request
	for i, l := range limitsUnderTest() {
		p := compile(t, l)
		for j := range 4 {
			reqs = append(reqs, store.Request{Key: fmt.Sprintf("%d-%d", i, j), Params: p, Cost: 10, Now: t0})
		}
	}
	out := make([]sluice.Decision, len(reqs))
	for round := range 6 {
		if err := s.CheckAll(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out {
			if want := round < 5; d.Allowed != want {
				t.Fatalf("round %d, request %d: allowed %v, want %v", round, i, d.Allowed, want)
			}
		}
	}
	for _, r := range reqs {
		if got := remaining(t, s, r.Key, r.Params, t0); got != 0 {
			t.Errorf("%s: remaining %d, want 0", r.Key, got)
		}
	}
}

func TestReset(t *testing.T) {
	p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 3, Window: time.Minute})
	s := newStore(t, Config{})
	decide(t, s, "a", p, 3, t0)
	decide(t, s, "b", p, 3, t0)
	if err := s.Reset(context.Background(), "a", "never-seen"); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, s, "a", p, t0); got != 3 {
		t.Errorf("a after Reset: remaining %d, want 3", got)
	}
	if got := remaining(t, s, "b", p, t0); got != 0 {
		t.Errorf("b (not reset): remaining %d, want 0", got)
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len() = %d, want 1", got)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Config{MaxLogEntries: 100})
	p := compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 5, Window: time.Minute})
	bigLog := compile(t, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 101, Window: time.Minute})
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		reqs     []store.Request
		out      int
		want     []error
		contains string
	}{
		{"negative cost", ctx, []store.Request{{Key: "a", Params: p, Cost: 1}, {Key: "b", Params: p, Cost: -1}}, 2, []error{sluice.ErrInvalidCost}, "cost -1"},
		{"no params", ctx, []store.Request{{Key: "a"}}, 1, []error{sluice.ErrInvalidLimit}, "no params"},
		{"unknown algorithm", ctx, []store.Request{{Key: "a", Params: &algorithm.Params{Algorithm: 99}}}, 1, []error{sluice.ErrInvalidLimit, sluice.ErrUnknownAlgorithm}, ""},
		{"log above cap", ctx, []store.Request{{Key: "a", Params: bigLog, Cost: 1}}, 1, []error{sluice.ErrInvalidLimit, ErrLogTooLarge}, "sliding_window_counter"},
		{"short output", ctx, []store.Request{{Key: "a", Params: p, Cost: 1}}, 0, []error{ErrShortOutput}, ""},
		{"canceled", canceled, []store.Request{{Key: "a", Params: p, Cost: 1}}, 1, []error{sluice.ErrStoreUnavailable, context.Canceled}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, all := range []bool{false, true} {
				out := make([]sluice.Decision, tc.out)
				check := s.Check
				if all {
					check = s.CheckAll
				}
				err := check(tc.ctx, tc.reqs, out)
				for _, want := range tc.want {
					if !errors.Is(err, want) {
						t.Errorf("CheckAll %v: error %v, want one wrapping %v", all, err, want)
					}
				}
				if err != nil && !strings.Contains(err.Error(), tc.contains) {
					t.Errorf("CheckAll %v: error %q does not mention %q", all, err, tc.contains)
				}
				if s.Len() != 0 {
					t.Errorf("CheckAll %v: a failed call stored %d keys", all, s.Len())
				}
			}
		})
	}
	if _, err := s.Decide(store.Request{Key: "a", Params: p, Cost: -2}); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Errorf("Decide with a negative cost: error %v, want one wrapping ErrInvalidCost", err)
	}
}

func TestBadConfig(t *testing.T) {
	for _, cfg := range []Config{{MaxKeys: -1}, {Shards: -1}, {MaxLogEntries: -1}, {MaxKeys: maxKeysLimit + 1}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
}

func TestShardCount(t *testing.T) {
	for _, tc := range []struct{ maxKeys, shards, want int }{
		{0, 0, DefaultShards},
		{1, 0, 1},
		{100, 0, 8},
		{1000, 3, 4},
		{1 << 20, 1 << 20, 1 << 16},
	} {
		s := newStore(t, Config{MaxKeys: tc.maxKeys, Shards: tc.shards})
		if got := len(s.shards); got != tc.want {
			t.Errorf("MaxKeys %d, Shards %d: %d shards, want %d", tc.maxKeys, tc.shards, got, tc.want)
		}
		total := 0
		for i := range s.shards {
			total += s.shards[i].capacity
		}
		if want := max(tc.maxKeys, 0); want != 0 && total != want {
			t.Errorf("MaxKeys %d: shard capacities add up to %d", tc.maxKeys, total)
		}
	}
}

func TestClose(t *testing.T) {
	p := compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 5, Window: time.Minute})
	s := newStore(t, Config{})
	decide(t, s, "a", p, 1, t0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(store.Request{Key: "a", Params: p, Cost: 1}); !errors.Is(err, ErrClosed) || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Decide after Close: error %v, want ErrClosed wrapping ErrStoreUnavailable", err)
	}
	if err := s.Reset(context.Background(), "a"); !errors.Is(err, ErrClosed) {
		t.Errorf("Reset after Close: error %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestZeroNowUsesClock(t *testing.T) {
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Minute})
	now := t0
	s := newStore(t, Config{Now: func() time.Time { return now }})
	if d := decide(t, s, "a", p, 1, time.Time{}); !d.Allowed {
		t.Fatalf("first request denied: %+v", d)
	}
	if d := decide(t, s, "a", p, 1, time.Time{}); d.Allowed {
		t.Fatalf("second request in the window allowed: %+v", d)
	}
	now = t0.Add(time.Minute)
	if d := decide(t, s, "a", p, 1, time.Time{}); !d.Allowed {
		t.Fatalf("request in the next window denied: %+v", d)
	}
}

func TestDecideDoesNotAllocate(t *testing.T) {
	for _, l := range limitsUnderTest() {
		if l.Algorithm == sluice.SlidingWindowLog {
			continue
		}
		p := compile(t, l)
		s := newStore(t, Config{})
		at := t0
		keys := []string{"a", "b", "c"}
		i := 0
		allocs := testing.AllocsPerRun(1000, func() {
			at = at.Add(time.Second)
			i++
			if _, err := s.Decide(store.Request{Key: keys[i%len(keys)], Params: p, Cost: 1, Now: at}); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Decide, want 0", l.Algorithm, allocs)
		}
	}
}
