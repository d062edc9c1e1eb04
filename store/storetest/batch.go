// Checks of batches against the model: Check, CheckAll, their instants.

package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// testCheckDuplicates checks that a key appearing twice in a Check sees the
// effect of its first request.
func testCheckDuplicates(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 3, Window: time.Minute})
		k := key(t, a.String())
		reqs := []store.Request{{Key: k, Params: p, Cost: 2, Now: T0}, {Key: k, Params: p, Cost: 1, Now: T0}, {Key: k, Params: p, Cost: 1, Now: T0}}
		m := NewModel()
		out := make([]sluice.Decision, len(reqs))
		if err := do(context.Background(), s, false, reqs, out); err != nil {
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
		if err := do(context.Background(), s, false, reqs, out); err != nil {
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
		if err := do(ctx, s, true, reqs, out); err != nil {
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
	if err := do(ctx, s, true, reqs, out); err != nil {
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
		if err := do(context.Background(), s, true, reqs, out); err != nil {
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
				err = do(context.Background(), s, true, reqs, out)
				want = m.DecideAll(reqs)
			} else {
				err = do(context.Background(), s, false, reqs, out)
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
