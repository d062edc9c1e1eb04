// Checks of time and state: clocks, shared state, Reset, bad input, races.

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
		if err := do(ctx, s, false, reqs, out); !errors.Is(err, c.want) {
			t.Errorf("Check with %s: got %v, want %v", c.name, err, c.want)
		}
		if err := do(ctx, s, true, reqs, out); !errors.Is(err, c.want) {
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
					if err := do(context.Background(), s, false, []store.Request{{Key: key, Params: p, Cost: 1, Now: T0}}, out); err != nil {
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

// testAfter checks requests decided ahead of their instant (a
// reservation): the store decides them at Now + After, as the model does,
// and requests at Now that follow see their cost consumed.
func testAfter(t *testing.T, s Store, key keyFunc) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, l := range Limits() {
		p := compile(t, l)
		k := key(t, limitName(l))
		m := NewModel()
		now := T0
		for i := range 60 {
			now = now.Add(time.Duration(rng.Int64N(int64(l.Window)/4+1)) / time.Microsecond * time.Microsecond)
			r := store.Request{Key: k, Params: p, Cost: rng.Int64N(p.Burst + 1), Now: now}
			want := m.Decide(r)
			if !want.Allowed && want.RetryAfter > 0 && rng.IntN(2) == 0 {
				// Reserve it: decide it again when it would be admitted.
				r.After = want.RetryAfter
				want = m.Decide(r)
			}
			got := check(t, s, r)
			if got != want {
				t.Fatalf("%s: request %d (cost %d, after %s): got %+v, want %+v", limitName(l), i, r.Cost, r.After, got, want)
			}
		}
	}
}

// testAfterStoreClock checks After on the store's clock: a unit reserved
// for when a limit of 1 is restored is admitted and consumed then, so that
// neither a second reservation for that instant nor a request now is.
func testAfterStoreClock(t *testing.T, s Store, key keyFunc) {
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 1, Window: time.Hour})
		k := key(t, a.String())
		if d := check(t, s, store.Request{Key: k, Params: p, Cost: 1}); !d.Allowed {
			t.Fatalf("%s: first request: got %+v, want allowed", a, d)
		}
		d := check(t, s, store.Request{Key: k, Params: p, Cost: 1})
		if d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("%s: second request: got %+v, want denied with a retry", a, d)
		}
		after := d.RetryAfter
		if d := check(t, s, store.Request{Key: k, Params: p, Cost: 1, After: after}); !d.Allowed {
			t.Errorf("%s: request %s ahead: got %+v, want allowed", a, after, d)
		}
		if d := check(t, s, store.Request{Key: k, Params: p, Cost: 1, After: after}); d.Allowed {
			t.Errorf("%s: second request %s ahead: got %+v, want denied", a, after, d)
		}
		if d := check(t, s, store.Request{Key: k, Params: p, Cost: 1}); d.Allowed {
			t.Errorf("%s: request now after the reservation: got %+v, want denied", a, d)
		}
	}
}
