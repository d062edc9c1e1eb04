// Package storetest is the conformance suite of Sluice's stores: Run checks
// that a store decides exactly as the pure functions of package algorithm,
// request for request, for every algorithm, so that the memory store, Redis
// and Redis Cluster provably decide alike.
//
// Every test passes explicit instants, so the suite is deterministic. Keys
// carry a random nonce, so several runs may share one Redis server.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Store is what the suite needs of a store: the contract of package store.
type Store interface {
	Check(ctx context.Context, reqs []store.Request, out []sluice.Decision) error
	CheckAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error
	Reset(ctx context.Context, keys ...string) error
}

// T0 is the instant the suite's sequences start at.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Limits returns the limits the suite runs for each algorithm: a plain one,
// a burst different from the limit (which the window algorithms ignore), a
// limit of 1, a window long enough to need a coarser quantum, a very short
// window, a burst so far above the limit that a bucket takes longer than
// the largest time.Duration to restore, and one so far above that a bucket
// takes longer than an int64 of microseconds since the epoch reaches (and
// than a Lua number written in a Redis command counts in milliseconds).
func Limits() []sluice.Limit {
	var ls []sluice.Limit
	for _, a := range sluice.Algorithms {
		ls = append(ls,
			sluice.Limit{Algorithm: a, Limit: 10, Window: time.Second},
			sluice.Limit{Algorithm: a, Limit: 50, Window: time.Minute, Burst: 20},
			sluice.Limit{Algorithm: a, Limit: 1, Window: 300 * time.Millisecond},
			sluice.Limit{Algorithm: a, Limit: 1000, Window: 300 * 24 * time.Hour, Burst: 3},
			sluice.Limit{Algorithm: a, Limit: 7, Window: 1500 * time.Microsecond},
			sluice.Limit{Algorithm: a, Limit: 1, Window: 24 * time.Hour, Burst: 200_000},
			sluice.Limit{Algorithm: a, Limit: 1, Window: sluice.MaxWindow, Burst: 71_000_000},
		)
	}
	return ls
}

// Model decides requests with the pure functions of package algorithm,
// keeping each key's state in a map: what every store must agree with. It
// is not safe for concurrent use.
type Model struct {
	states map[string]algorithm.State
	logs   map[string][]int64
}

// NewModel returns a model with no state.
func NewModel() *Model {
	return &Model{states: map[string]algorithm.State{}, logs: map[string][]int64{}}
}

// Decide decides r, which must have a non-zero Now.
func (m *Model) Decide(r store.Request) sluice.Decision {
	return m.decide(r, true)
}

// decide decides r; a refusal counted under CountRefused is kept only
// when counted is true (CheckAll keeps none).
func (m *Model) decide(r store.Request, counted bool) sluice.Decision {
	now := r.Now.UnixMicro()
	if r.Params.Algorithm == sluice.SlidingWindowLog {
		nl, d := algorithm.ApplyLog(r.Params, append([]int64(nil), m.logs[r.Key]...), now, r.Cost)
		if d.Allowed && r.Cost > 0 {
			m.logs[r.Key] = nl
		}
		return d
	}
	ns, d := algorithm.Apply(r.Params, m.states[r.Key], now, r.Cost)
	if d.Allowed || counted {
		m.states[r.Key] = ns
	}
	return d
}

// DecideAll decides reqs as store.CheckAll does: all consume, or none does;
// when none does, the requests that alone would have been admitted report
// their key as it stands, limited, with no retry.
func (m *Model) DecideAll(reqs []store.Request) []sluice.Decision {
	saved := m.clone()
	out := make([]sluice.Decision, len(reqs))
	all := true
	for i, r := range reqs {
		out[i] = m.decide(r, false)
		all = all && out[i].Allowed
	}
	if all {
		return out
	}
	*m = *saved
	for i, r := range reqs {
		if !out[i].Allowed {
			continue
		}
		peek := saved.clone()
		r.Cost = 0
		out[i] = peek.Decide(r)
		out[i].Allowed, out[i].Reason, out[i].RetryAfter = false, sluice.ReasonLimited, 0
	}
	return out
}

func (m *Model) clone() *Model {
	c := NewModel()
	for k, v := range m.states {
		c.states[k] = v
	}
	for k, v := range m.logs {
		c.logs[k] = append([]int64(nil), v...)
	}
	return c
}

// Run runs the suite. newStore returns a store for one subtest; stores may
// share their state (a Redis server), as the suite's keys never repeat
// across calls of Run.
func Run(t *testing.T, newStore func(t *testing.T) Store) {
	nonce := fmt.Sprintf("%08x", rand.Uint32())
	key := func(t *testing.T, name string) string {
		return fmt.Sprintf("st:%s:%s:{%s}:%s", nonce, t.Name(), name, name)
	}
	t.Run("Sequences", func(t *testing.T) { testSequences(t, newStore(t), key) })
	t.Run("Random", func(t *testing.T) { testRandom(t, newStore(t), key) })
	t.Run("DenyAll", func(t *testing.T) { testDenyAll(t, newStore(t), key) })
	t.Run("CostAboveCapacity", func(t *testing.T) { testCostAboveCapacity(t, newStore(t), key) })
	t.Run("CountRefused", func(t *testing.T) { testCountRefused(t, newStore(t), key) })
	t.Run("CheckDuplicateKeys", func(t *testing.T) { testCheckDuplicates(t, newStore(t), key) })
	t.Run("CheckMixed", func(t *testing.T) { testCheckMixed(t, newStore(t), key) })
	t.Run("CheckAll", func(t *testing.T) { testCheckAll(t, newStore(t), key) })
	t.Run("CheckAllRandom", func(t *testing.T) { testCheckAllRandom(t, newStore(t), key) })
	t.Run("BatchInstants", func(t *testing.T) { testBatchInstants(t, newStore(t), key) })
	t.Run("RandomParams", func(t *testing.T) { testRandomParams(t, newStore(t), key) })
	t.Run("ClockBack", func(t *testing.T) { testClockBack(t, newStore(t), key) })
	t.Run("SharedState", func(t *testing.T) { testSharedState(t, newStore(t), key) })
	t.Run("Reset", func(t *testing.T) { testReset(t, newStore(t), key) })
	t.Run("StoreClock", func(t *testing.T) { testStoreClock(t, newStore(t), key) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, newStore(t), key) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newStore(t), key) })
}

type keyFunc func(t *testing.T, name string) string

func compile(t *testing.T, l sluice.Limit) *algorithm.Params {
	t.Helper()
	p, err := algorithm.Compile(l)
	if err != nil {
		t.Fatalf("Compile(%+v): %v", l, err)
	}
	return &p
}

func limitName(l sluice.Limit) string {
	return fmt.Sprintf("%s/%d-per-%s-burst-%d", l.Algorithm, l.Limit, l.Window, l.Burst)
}

func check(t *testing.T, s Store, r store.Request) sluice.Decision {
	t.Helper()
	out := make([]sluice.Decision, 1)
	if err := s.Check(context.Background(), []store.Request{r}, out); err != nil {
		t.Fatalf("Check(%s cost %d): %v", r.Key, r.Cost, err)
	}
	return out[0]
}

// decideOne decides r alone through CheckAll (all) or Check, and returns
// the store's decision and the model's.
func decideOne(s Store, m *Model, r store.Request, all bool) (got, want sluice.Decision, err error) {
	out := make([]sluice.Decision, 1)
	if all {
		err = s.CheckAll(context.Background(), []store.Request{r}, out)
		return out[0], m.DecideAll([]store.Request{r})[0], err
	}
	err = s.Check(context.Background(), []store.Request{r}, out)
	return out[0], m.Decide(r), err
}

// step is one request of a sequence: dt after the previous one.
type step struct {
	dt   time.Duration
	cost int64
}

// testSequences runs hand-written sequences: a burst to exhaustion, cost 0
// reads, a cost above the capacity, refill, a clock that goes back, and a
// long pause. No duration is ever negative.
func testSequences(t *testing.T, s Store, key keyFunc) {
	for _, l := range Limits() {
		t.Run(limitName(l), func(t *testing.T) {
			p := compile(t, l)
			w := l.Window
			b := max(p.Burst, 1)
			steps := []step{{0, 0}, {0, 1}, {0, 0}, {0, b + 1}, {0, b - 1}, {0, 1}, {0, 0},
				{w / 7, 1}, {w / 3, 2}, {w / 2, 1}, {-w / 4, 1}, {0, 0}, {w / 10, b}, {w, 1}, {3 * w, b}, {0, 1},
				{w - 1, 1}, {1, 1}, {2 * w, 0}, {time.Microsecond, 1}}
			m := NewModel()
			k := key(t, "seq")
			at := T0
			for i, st := range steps {
				at = at.Add(st.dt)
				r := store.Request{Key: k, Params: p, Cost: max(st.cost, 0), Now: at}
				want := m.Decide(r)
				if got := check(t, s, r); got != want || got.ResetAfter < 0 || got.RetryAfter < 0 {
					t.Fatalf("step %d (cost %d at +%s): got %+v, want %+v", i, r.Cost, at.Sub(T0), got, want)
				}
			}
		})
	}
}

// testRandom compares a random sequence (fixed seed) over three keys with
// the model.
func testRandom(t *testing.T, s Store, key keyFunc) {
	for _, l := range Limits() {
		t.Run(limitName(l), func(t *testing.T) {
			p := compile(t, l)
			m := NewModel()
			rng := rand.New(rand.NewPCG(11, uint64(l.Algorithm)<<32|uint64(l.Limit)))
			keys := []string{key(t, "a"), key(t, "b"), key(t, "c")}
			at := T0
			span := int64(l.Window/time.Microsecond) / 4
			for i := range 300 {
				at = at.Add(time.Duration(rng.Int64N(span+1)) * time.Microsecond)
				if rng.IntN(20) == 0 {
					at = at.Add(-time.Duration(rng.Int64N(span+1)) * time.Microsecond) // a clock that goes back
				}
				r := store.Request{Key: keys[rng.IntN(len(keys))], Params: p, Cost: rng.Int64N(p.Burst + 2), Now: at}
				want := m.Decide(r)
				if got := check(t, s, r); got != want {
					t.Fatalf("request %d (cost %d at +%s): got %+v, want %+v", i, r.Cost, at.Sub(T0), got, want)
				}
			}
		})
	}
}

func testDenyAll(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, DenyAll: true, Window: time.Second})
		for _, cost := range []int64{0, 1, 5} {
			r := store.Request{Key: key(t, a.String()), Params: p, Cost: cost, Now: T0}
			want := NewModel().Decide(r)
			if got := check(t, s, r); got != want || got.Allowed || got.Reason != sluice.ReasonDenyAll {
				t.Errorf("%s cost %d: got %+v, want %+v (deny_all)", a, cost, got, want)
			}
		}
	}
}

// testCostAboveCapacity checks that a cost above the capacity, never
// admitted, reports the remaining and the reset of its key as they stand
// (those a read reports), consumes nothing, through Check and CheckAll,
// alone and in a batch.
func testCostAboveCapacity(t *testing.T, s Store, key keyFunc) {
	ctx := context.Background()
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			p := compile(t, sluice.Limit{Algorithm: a, Limit: 10, Window: time.Minute})
			k, other := key(t, "over"), key(t, "other")
			check(t, s, store.Request{Key: k, Params: p, Cost: 4, Now: T0})
			at := T0.Add(time.Second)
			read := check(t, s, store.Request{Key: k, Params: p, Now: at})
			if read.Remaining < 6 || read.Remaining == 10 || read.ResetAfter <= 0 {
				t.Fatalf("read after 4 of 10: %+v, want 6 to 9 remaining and a reset", read)
			}
			want := sluice.Decision{Reason: sluice.ReasonCostExceedsCapacity, Limit: 10, Remaining: read.Remaining, ResetAfter: read.ResetAfter}
			over := store.Request{Key: k, Params: p, Cost: 11, Now: at}
			if got := check(t, s, over); got != want {
				t.Errorf("Check cost 11: got %+v, want %+v", got, want)
			}
			out := make([]sluice.Decision, 2)
			batch := []store.Request{{Key: other, Params: p, Cost: 1, Now: at}, over}
			if err := s.Check(ctx, batch, out); err != nil {
				t.Fatal(err)
			}
			if out[1] != want || !out[0].Allowed {
				t.Errorf("Check batch: got %+v, want an admitted request and %+v", out, want)
			}
			if err := s.CheckAll(ctx, batch, out); err != nil {
				t.Fatal(err)
			}
			if out[1] != want || out[0].Allowed {
				t.Errorf("CheckAll batch: got %+v, want a refused request and %+v", out, want)
			}
			if got := check(t, s, store.Request{Key: k, Params: p, Now: at}); got != read {
				t.Errorf("read after: got %+v, want %+v (nothing consumed)", got, read)
			}
		})
	}
}

// testCountRefused checks a fixed window that counts the requests it
// refuses (algorithm.Params.CountRefused): refused costs are charged
// through Check, so that the window stays over its limit, reads included,
// until it ends; CheckAll still consumes nothing when it refuses; a limit
// of 0 admits reads until a refusal is counted.
func testCountRefused(t *testing.T, s Store, key keyFunc) {
	ctx := context.Background()
	p := *compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Minute})
	p.CountRefused = true
	zero := p
	zero.Limit, zero.Burst = 0, 0
	m := NewModel()
	k, k0 := key(t, "refused"), key(t, "zero")
	at := T0.Add(time.Second)
	const limited, never = sluice.ReasonLimited, sluice.ReasonCostExceedsCapacity
	for i, st := range []struct {
		p         *algorithm.Params
		key       string
		dt        time.Duration
		cost      int64
		allowed   bool
		reason    sluice.Reason
		remaining int64
	}{
		{&p, k, 0, 2, true, 0, 1},
		{&p, k, 0, 0, true, 0, 1},
		{&p, k, 0, 2, false, limited, 0}, // refused, counted: 4 of 3
		{&p, k, 0, 0, false, limited, 0}, // a read stays over the limit
		{&p, k, 0, 1, false, limited, 0},
		{&p, k, 0, 4, false, never, 0},
		{&p, k, time.Minute, 0, true, 0, 3}, // the next window
		{&p, k, 0, 4, false, never, 0},      // counted: over for the window
		{&p, k, 0, 1, false, limited, 0},
		{&zero, k0, 0, 0, true, 0, 0}, // a limit of 0 admits reads
		{&zero, k0, 0, 1, false, never, 0},
		{&zero, k0, 0, 0, false, limited, 0}, // until a refusal is counted
	} {
		at = at.Add(st.dt)
		r := store.Request{Key: st.key, Params: st.p, Cost: st.cost, Now: at}
		want := m.Decide(r)
		got := check(t, s, r)
		if got != want || got.Allowed != st.allowed || got.Reason != st.reason || got.Remaining != st.remaining || got.ResetAfter <= 0 && got.Remaining < st.p.Limit {
			t.Fatalf("step %d (limit %d, cost %d): got %+v, want %+v (allowed %v, %s, remaining %d)", i, st.p.Limit, st.cost, got, want, st.allowed, st.reason, st.remaining)
		}
	}
	// CheckAll refuses without counting, and its requests, alone or with
	// the same key twice, decide as the model's.
	a, b := key(t, "all-a"), key(t, "all-b")
	batch := []store.Request{{Key: a, Params: &p, Cost: 2, Now: at}, {Key: b, Params: &p, Cost: 2, Now: at}, {Key: a, Params: &p, Cost: 2, Now: at}}
	out := make([]sluice.Decision, len(batch))
	if err := s.CheckAll(ctx, batch, out); err != nil {
		t.Fatal(err)
	}
	if want := m.DecideAll(batch); fmt.Sprint(out) != fmt.Sprint(want) || out[2].Allowed {
		t.Errorf("CheckAll: got %+v, want %+v", out, want)
	}
	for _, kk := range []string{a, b} {
		r := store.Request{Key: kk, Params: &p, Now: at}
		if got, want := check(t, s, r), m.Decide(r); got != want || got.Remaining != 3 {
			t.Errorf("%s after CheckAll: got %+v, want %+v (nothing counted)", kk, got, want)
		}
	}
	// A random sequence, through Check alone and in batches.
	rng := rand.New(rand.NewPCG(5, 7))
	keys := []string{key(t, "r1"), key(t, "r2")}
	for i := range 200 {
		at = at.Add(time.Duration(rng.Int64N(int64(20 * time.Second))))
		n := 1 + rng.IntN(3)
		reqs := make([]store.Request, n)
		for j := range reqs {
			reqs[j] = store.Request{Key: keys[rng.IntN(len(keys))], Params: &p, Cost: rng.Int64N(p.Limit + 2), Now: at}
		}
		got := make([]sluice.Decision, n)
		if err := s.Check(ctx, reqs, got); err != nil {
			t.Fatal(err)
		}
		for j, r := range reqs {
			if want := m.Decide(r); got[j] != want {
				t.Fatalf("request %d.%d (cost %d at +%s): got %+v, want %+v", i, j, r.Cost, at.Sub(T0), got[j], want)
			}
		}
	}
}

// testCheckDuplicates checks that a key appearing twice in a Check sees the
// effect of its first request.
func testCheckDuplicates(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 3, Window: time.Minute})
		k := key(t, a.String())
		reqs := []store.Request{{Key: k, Params: p, Cost: 2, Now: T0}, {Key: k, Params: p, Cost: 1, Now: T0}, {Key: k, Params: p, Cost: 1, Now: T0}}
		m := NewModel()
		out := make([]sluice.Decision, len(reqs))
		if err := s.Check(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
		for i, r := range reqs {
			if want := m.Decide(r); out[i] != want {
				t.Errorf("%s request %d: got %+v, want %+v", a, i, out[i], want)
			}
		}
	}
}

// testCheckMixed compares random batches of Check (fixed seed) with the
// model: every limit of Limits (each also as an equal copy of its own),
// deny-all limits, costs from 0 to above the capacity, keys that repeat
// within a batch, and a clock that moves on between batches.
func testCheckMixed(t *testing.T, s Store, key keyFunc) {
	var params []*algorithm.Params
	for _, l := range Limits() {
		p := compile(t, l)
		dup := *p
		params = append(params, p, &dup)
	}
	params = append(params, compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Window: time.Second, DenyAll: true}))
	keys := make([]string, len(params)/2+1)
	for i := range keys {
		keys[i] = key(t, fmt.Sprintf("k%d", i))
	}
	m := NewModel()
	rng := rand.New(rand.NewPCG(5, 8))
	at := T0
	for b := range 80 {
		at = at.Add(time.Duration(rng.Int64N(200_000)) * time.Microsecond)
		reqs := make([]store.Request, 1+rng.IntN(60))
		for i := range reqs {
			// A key keeps one limit (its algorithm decides the format of
			// its state): key k uses limit k or its copy; the last key,
			// the deny-all limit.
			k := rng.IntN(len(keys))
			p := params[len(params)-1]
			if k < len(keys)-1 {
				p = params[2*k+rng.IntN(2)]
			}
			reqs[i] = store.Request{Key: keys[k], Params: p, Cost: rng.Int64N(p.Burst + 2), Now: at}
		}
		out := make([]sluice.Decision, len(reqs))
		if err := s.Check(context.Background(), reqs, out); err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		for i, r := range reqs {
			if want := m.Decide(r); out[i] != want {
				t.Fatalf("batch %d request %d (%s, %s cost %d): got %+v, want %+v", b, i, r.Key, r.Params.Algorithm, r.Cost, out[i], want)
			}
		}
	}
}

// testCheckAll checks all-or-nothing batches: over keys of different hash
// tags, mixed algorithms, and a key appearing twice.
func testCheckAll(t *testing.T, s Store, key keyFunc) {
	ctx := context.Background()
	m := NewModel()
	var ps []*algorithm.Params
	for _, a := range sluice.Algorithms {
		ps = append(ps, compile(t, sluice.Limit{Algorithm: a, Limit: 5, Window: time.Minute}))
	}
	// One key per algorithm, each with its own hash tag (on a cluster,
	// spread over the slots), plus a shared one.
	reqsAt := func(at time.Time, cost int64) []store.Request {
		var reqs []store.Request
		for i, p := range ps {
			reqs = append(reqs, store.Request{Key: fmt.Sprintf("%s{tag%d}", key(t, "k"), i), Params: p, Cost: cost, Now: at})
		}
		return reqs
	}
	for round := range 8 {
		at := T0.Add(time.Duration(round) * time.Second)
		reqs := reqsAt(at, 1)
		if round == 3 {
			// exhaust one key alone: the following batches are denied
			r := reqs[2]
			r.Cost = 5
			if got, want := check(t, s, r), m.Decide(r); got != want {
				t.Fatalf("exhausting: got %+v, want %+v", got, want)
			}
		}
		if round == 6 {
			reqs = append(reqs, reqs[0]) // a key twice
		}
		out := make([]sluice.Decision, len(reqs))
		if err := s.CheckAll(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		want := m.DecideAll(reqs)
		for i := range reqs {
			if out[i] != want[i] {
				t.Errorf("round %d request %d (%s): got %+v, want %+v", round, i, reqs[i].Params.Algorithm, out[i], want[i])
			}
		}
	}
	// After the window every key is back.
	out := make([]sluice.Decision, len(ps))
	reqs := reqsAt(T0.Add(time.Hour), 0)
	if err := s.CheckAll(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if out[i].Remaining != 5 {
			t.Errorf("after an hour, %s remaining %d, want 5", reqs[i].Params.Algorithm, out[i].Remaining)
		}
	}
}

// testCheckAllRandom compares random all-or-nothing batches with the model.
func testCheckAllRandom(t *testing.T, s Store, key keyFunc) {
	rng := rand.New(rand.NewPCG(5, 6))
	var ps []*algorithm.Params
	for _, l := range Limits() {
		if l.Window <= time.Hour {
			ps = append(ps, compile(t, l))
		}
	}
	m := NewModel()
	keys := make([]string, 6)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s{r%d}", key(t, "k"), i)
	}
	at := T0
	for round := range 200 {
		at = at.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		n := 1 + rng.IntN(4)
		reqs := make([]store.Request, n)
		for i := range reqs {
			k := rng.IntN(len(keys))
			p := ps[(k*7)%len(ps)] // one Params per key
			reqs[i] = store.Request{Key: keys[k], Params: p, Cost: rng.Int64N(3), Now: at}
		}
		out := make([]sluice.Decision, n)
		if err := s.CheckAll(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
		want := m.DecideAll(reqs)
		for i := range reqs {
			if out[i] != want[i] {
				t.Fatalf("round %d request %d (%s cost %d): got %+v, want %+v", round, i, reqs[i].Params.Algorithm, reqs[i].Cost, out[i], want[i])
			}
		}
	}
}

// testClockBack fills a key, then decides requests at instants before the
// state's, some far before (more than a bucket takes to restore), through
// Check and through CheckAll of one request, and compares both with the
// model: the waits they report count from the instant the state stands at.
func testClockBack(t *testing.T, s Store, key keyFunc) {
	for _, l := range Limits() {
		t.Run(limitName(l), func(t *testing.T) {
			p := compile(t, l)
			w := l.Window
			b := max(p.Burst, 1)
			steps := []step{{w, b}, {-w / 3, 0}, {0, 1}, {-w, 1}, {0, 0}, {-3 * w, 1}, {0, 0}, {w / 2, 1},
				{5 * w, b}, {-w / 10, 1}, {w / 20, 0}, {-2 * w, b}, {7 * w, 1},
				// Checks a window after the entries of a log, then back
				// within their window: the entries still count.
				{3 * w, max(b/2, 1)}, {w / 2, 1}, {3 * w / 4, 0}, {-w / 2, 0}, {0, b}}
			for _, all := range []bool{false, true} {
				m := NewModel()
				k := key(t, fmt.Sprintf("back-%v", all))
				at := T0
				for i, st := range steps {
					at = at.Add(st.dt)
					r := store.Request{Key: k, Params: p, Cost: st.cost, Now: at}
					got, want, err := decideOne(s, m, r, all)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Fatalf("all or nothing %v, step %d (cost %d at %+s): got %+v, want %+v", all, i, r.Cost, at.Sub(T0), got, want)
					}
				}
			}
		})
	}
}

// testBatchInstants compares random batches, through Check and CheckAll,
// over four keys of random small Params of any algorithm, with keys
// repeated and some requests at an earlier instant than the others of their
// batch: a key that appears twice is decided on the state its first
// request leaves, whatever their instants.
func testBatchInstants(t *testing.T, s Store, key keyFunc) {
	rng := rand.New(rand.NewPCG(77, 78))
	for trace := range 100 {
		var ps []*algorithm.Params
		for range 4 {
			a := sluice.Algorithms[rng.IntN(len(sluice.Algorithms))]
			l := sluice.Limit{Algorithm: a, Limit: 1 + rng.Int64N(8), Window: time.Duration(1+rng.Int64N(30)) * time.Microsecond}
			if rng.IntN(2) == 0 {
				l.Burst = 1 + rng.Int64N(10)
			}
			ps = append(ps, compile(t, l))
		}
		keys := make([]string, 4)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s:%d{x}%d", key(t, "tb"), trace, i)
		}
		m := NewModel()
		at := T0.UnixMicro()
		for round := range 40 {
			at += rng.Int64N(10)
			n := 1 + rng.IntN(5)
			reqs := make([]store.Request, n)
			for i := range reqs {
				k := rng.IntN(len(keys))
				now := at
				if rng.IntN(5) == 0 {
					now -= rng.Int64N(40)
				}
				reqs[i] = store.Request{Key: keys[k], Params: ps[k], Cost: rng.Int64N(ps[k].Burst + 1), Now: time.UnixMicro(now)}
			}
			out := make([]sluice.Decision, n)
			var want []sluice.Decision
			var err error
			all := rng.IntN(2) == 0
			if all {
				err = s.CheckAll(context.Background(), reqs, out)
				want = m.DecideAll(reqs)
			} else {
				err = s.Check(context.Background(), reqs, out)
				for _, r := range reqs {
					want = append(want, m.Decide(r))
				}
			}
			if err != nil {
				t.Fatalf("trace %d round %d: %v", trace, round, err)
			}
			for i := range reqs {
				if out[i] != want[i] {
					t.Fatalf("trace %d round %d (all or nothing %v) request %d (%+v cost %d at %dµs): got %+v, want %+v", trace, round, all, i, *reqs[i].Params, reqs[i].Cost, reqs[i].Now.UnixMicro(), out[i], want[i])
				}
			}
		}
	}
}

// testRandomParams compares random traces with the model, each on random
// Params of one algorithm at three priorities sharing the state (0.8x, 1x
// and 1.2x, compiled at one quantum): windows of a few microseconds, of
// seconds, and limits near sluice.MaxLimit at a coarser quantum; costs of
// 0, up to the burst and above it; a clock that goes back now and then;
// through Check and through CheckAll of one request.
func testRandomParams(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		rng := rand.New(rand.NewPCG(uint64(a), 99))
		for trace := range 100 {
			var l sluice.Limit
			l.Algorithm = a
			switch {
			case rng.IntN(6) == 0 && a != sluice.SlidingWindowLog:
				l.Limit = sluice.MaxLimit - rng.Int64N(1000)
				l.Window = time.Duration(10_000*(1+rng.Int64N(3))) * time.Microsecond
			case rng.IntN(4) == 0:
				l.Limit = 1 + rng.Int64N(2000)
				l.Window = time.Duration(1+rng.Int64N(5_000_000)) * time.Microsecond
			default:
				l.Limit = 1 + rng.Int64N(12)
				l.Window = time.Duration(1+rng.Int64N(40)) * time.Microsecond
			}
			if rng.IntN(2) == 0 {
				l.Burst = min(1+rng.Int64N(2*l.Limit), sluice.MaxLimit)
			}
			var ps [3]algorithm.Params
			q := int64(1)
			for range 2 { // the second pass at the coarsest quantum of the first
				for i, m := range []float64{0.8, 1, 1.2} {
					v := l
					v.Limit = min(max(int64(float64(l.Limit)*m), 1), sluice.MaxLimit)
					if l.Burst > 0 {
						v.Burst = min(max(int64(float64(l.Burst)*m), 1), sluice.MaxLimit)
					}
					p, err := algorithm.CompileAt(v, q)
					if err != nil {
						t.Fatalf("CompileAt(%+v, %d): %v", v, q, err)
					}
					ps[i], q = p, max(q, p.Quantum)
				}
			}
			algorithm.ShareState(ps[:])
			m := NewModel()
			k := fmt.Sprintf("%s:%s:%d", key(t, "rp"), a, trace)
			at := T0.UnixMicro()
			w := ps[1].Window * ps[1].Quantum
			for i := range 60 {
				switch r := rng.IntN(10); {
				case r == 0:
					at -= rng.Int64N(2*w + 2)
				case r < 7:
					at += rng.Int64N(w/2 + 2)
				}
				p := &ps[rng.IntN(len(ps))]
				var cost int64
				switch rng.IntN(6) {
				case 0:
				case 1:
					cost = p.Burst + 1
				default:
					cost = 1 + rng.Int64N(p.Burst)
				}
				r := store.Request{Key: k, Params: p, Cost: cost, Now: time.UnixMicro(at)}
				all := rng.IntN(2) == 0
				got, want, err := decideOne(s, m, r, all)
				if err != nil {
					t.Fatalf("trace %d request %d: %v", trace, i, err)
				}
				if got != want {
					t.Fatalf("trace %d (%+v) request %d (cost %d at %dµs, all or nothing %v): got %+v, want %+v", trace, *p, i, cost, at, all, got, want)
				}
			}
		}
	}
}

// testSharedState decides keys with several Params sharing their state, as
// a rule's priority variants do (8, 10 and 12 per window, see
// algorithm.ShareState), through Check and CheckAll: first 12 units at the
// highest limit, then a request and reads at the others, then random
// requests (fixed seed). A state holding more than a limit allows reports
// Remaining 0, never less, and a read is always allowed.
func testSharedState(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			ps := []algorithm.Params{
				*compile(t, sluice.Limit{Algorithm: a, Limit: 8, Window: time.Second}),
				*compile(t, sluice.Limit{Algorithm: a, Limit: 10, Window: time.Second}),
				*compile(t, sluice.Limit{Algorithm: a, Limit: 12, Window: time.Second}),
			}
			algorithm.ShareState(ps)
			m := NewModel()
			keys := []string{key(t, "a"), key(t, "b")}
			decide := func(i int, r store.Request, all bool) {
				t.Helper()
				got, want, err := decideOne(s, m, r, all)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if got != want || got.Remaining < 0 || (r.Cost == 0 && !got.Allowed) {
					t.Fatalf("request %d (limit %d, cost %d at +%s, all %v): got %+v, want %+v", i, r.Params.Limit, r.Cost, r.Now.Sub(T0), all, got, want)
				}
			}
			for i, k := range keys {
				all := i == 1
				decide(0, store.Request{Key: k, Params: &ps[2], Cost: 12, Now: T0}, all)
				decide(1, store.Request{Key: k, Params: &ps[1], Cost: 1, Now: T0}, all)
				decide(2, store.Request{Key: k, Params: &ps[1], Cost: 0, Now: T0}, all)
				decide(3, store.Request{Key: k, Params: &ps[0], Cost: 0, Now: T0}, all)
			}
			// A window that is no whole number of emission intervals: 3
			// units at 12 per window leave GCRA a remainder of 9/12 of a
			// quantum, which the lower limits read.
			odd := make([]algorithm.Params, len(ps))
			for i := range ps {
				odd[i] = *compile(t, sluice.Limit{Algorithm: a, Limit: ps[i].Limit, Window: 1_000_011 * time.Microsecond})
			}
			algorithm.ShareState(odd)
			for i, k := range []string{key(t, "odd-a"), key(t, "odd-b")} {
				all := i == 1
				decide(0, store.Request{Key: k, Params: &odd[2], Cost: 3, Now: T0}, all)
				for j, r := range []store.Request{{Params: &odd[0]}, {Params: &odd[0], Cost: 1}, {Params: &odd[1], Cost: 8}, {Params: &odd[0], Cost: 6}} {
					r.Key, r.Now = k, T0
					decide(1+j, r, all)
				}
			}
			rng := rand.New(rand.NewPCG(3, uint64(a)))
			at := T0
			for i := range 200 {
				at = at.Add(time.Duration(rng.Int64N(100_000)) * time.Microsecond)
				p := &ps[rng.IntN(len(ps))]
				r := store.Request{Key: keys[rng.IntN(len(keys))], Params: p, Cost: rng.Int64N(p.Burst + 2), Now: at}
				decide(4+i, r, rng.IntN(2) == 0)
			}
		})
	}
}

func testReset(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 2, Window: time.Hour})
		k := key(t, a.String())
		r := store.Request{Key: k, Params: p, Cost: 2, Now: T0}
		if d := check(t, s, r); !d.Allowed {
			t.Fatalf("%s: first request denied: %+v", a, d)
		}
		if d := check(t, s, r); d.Allowed {
			t.Fatalf("%s: second request allowed: %+v", a, d)
		}
		if err := s.Reset(context.Background(), k, key(t, "never-seen")); err != nil {
			t.Fatal(err)
		}
		if d := check(t, s, r); !d.Allowed || d.Remaining != 0 {
			t.Errorf("%s after Reset: got %+v, want allowed with 0 remaining", a, d)
		}
	}
}

// testStoreClock checks requests whose Now is zero: decided at the store's
// clock, they consume as at any instant.
func testStoreClock(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 5, Window: time.Hour})
		k := key(t, a.String())
		d := check(t, s, store.Request{Key: k, Params: p, Cost: 3})
		if !d.Allowed || d.Remaining != 2 || d.ResetAfter <= 0 || d.ResetAfter > 2*time.Hour {
			t.Errorf("%s: got %+v, want allowed, 2 remaining, reset within two windows", a, d)
		}
		d = check(t, s, store.Request{Key: k, Params: p, Cost: 3})
		if d.Allowed || d.Remaining != 2 || d.RetryAfter <= 0 {
			t.Errorf("%s: got %+v, want denied, 2 remaining, a retry", a, d)
		}
	}
}

func testBadInput(t *testing.T, s Store, key keyFunc) {
	ctx := context.Background()
	p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 5, Window: time.Hour})
	out := make([]sluice.Decision, 2)
	good := store.Request{Key: key(t, "good"), Params: p, Cost: 1, Now: T0}
	cases := []struct {
		name string
		req  store.Request
		want error
	}{
		{"negative cost", store.Request{Key: key(t, "k"), Params: p, Cost: -1, Now: T0}, sluice.ErrInvalidCost},
		{"no params", store.Request{Key: key(t, "k"), Cost: 1, Now: T0}, sluice.ErrInvalidLimit},
		{"unknown algorithm", store.Request{Key: key(t, "k"), Params: &algorithm.Params{Algorithm: 99, Limit: 1, Burst: 1, Window: 1, Quantum: 1}, Cost: 1, Now: T0}, sluice.ErrInvalidLimit},
	}
	for _, c := range cases {
		reqs := []store.Request{good, c.req}
		if err := s.Check(ctx, reqs, out); !errors.Is(err, c.want) {
			t.Errorf("Check with %s: got %v, want %v", c.name, err, c.want)
		}
		if err := s.CheckAll(ctx, reqs, out); !errors.Is(err, c.want) {
			t.Errorf("CheckAll with %s: got %v, want %v", c.name, err, c.want)
		}
	}
	// Nothing was decided: the good key is untouched.
	if d := check(t, s, store.Request{Key: good.Key, Params: p, Cost: 0, Now: T0}); d.Remaining != 5 {
		t.Errorf("after rejected batches, remaining %d, want 5", d.Remaining)
	}
}

// testConcurrent races 16 goroutines on one key at one instant: exactly the
// limit is admitted, for every algorithm.
func testConcurrent(t *testing.T, s Store, key keyFunc) {
	const goroutines, each, limit = 16, 10, 37
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: limit, Window: time.Hour})
		if got := Admitted(t, []Store{s}, key(t, a.String()), p, goroutines, each); got != limit {
			t.Errorf("%s: admitted %d of %d, want exactly %d", a, got, goroutines*each, limit)
		}
	}
}

// Admitted races goroutines callers on each of stores, each checking key
// each times with cost 1 at T0, and returns how many checks were admitted.
// A store error fails t. The exactness tests of the stores use it.
func Admitted(t testing.TB, stores []Store, key string, p *algorithm.Params, goroutines, each int) int64 {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]sluice.Decision, 1)
				for range each {
					if err := s.Check(context.Background(), []store.Request{{Key: key, Params: p, Cost: 1, Now: T0}}, out); err != nil {
						t.Error(err)
						return
					}
					if out[0].Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	return admitted.Load()
}
