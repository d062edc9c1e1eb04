// Checks of single requests against the model: sequences, random traces, costs.

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
			if err := do(ctx, s, false, batch, out); err != nil {
				t.Fatal(err)
			}
			if out[1] != want || !out[0].Allowed {
				t.Errorf("Check batch: got %+v, want an admitted request and %+v", out, want)
			}
			if err := do(ctx, s, true, batch, out); err != nil {
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
	if err := do(ctx, s, true, batch, out); err != nil {
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
		if err := do(ctx, s, false, reqs, got); err != nil {
			t.Fatal(err)
		}
		for j, r := range reqs {
			if want := m.Decide(r); got[j] != want {
				t.Fatalf("request %d.%d (cost %d at +%s): got %+v, want %+v", i, j, r.Cost, at.Sub(T0), got[j], want)
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
