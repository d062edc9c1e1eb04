package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// TestMergedMatchesUnmerged decides random all-or-nothing batches with
// repeated keys twice, on two memory stores with the same history: as they
// are, and merged. Every algorithm is tried (only the fixed window and the
// sliding window log are merged); costs run from 0 to above the capacity,
// keys start fresh, partly used or exhausted, and another key sometimes
// denies the batch. The decisions must be equal, but for the documented
// retry-after of a log check denied while older entries are in the way.
func TestMergedMatchesUnmerged(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 25))
			var merged, approx, compared int
			for round := range 400 {
				limit := 1 + rng.Int64N(8)
				p := algorithm.MustCompile(sluice.Limit{Algorithm: a, Limit: limit, Window: time.Second})
				other := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Second})
				plain, err := memory.New(memory.Config{})
				if err != nil {
					t.Fatal(err)
				}
				both, err := memory.New(memory.Config{})
				if err != nil {
					t.Fatal(err)
				}
				key := fmt.Sprintf("k%d", round)
				// History: some units at earlier instants of the window.
				used := rng.Int64N(limit + 2)
				for u := range used {
					r := []store.Request{{Key: key, Params: &p, Cost: 1, Now: t0.Add(time.Duration(100+100*u) * time.Millisecond)}}
					for _, s := range []store.Store{plain, both} {
						if err := s.Do(context.Background(), &store.Batch{Reqs: r, Out: make([]sluice.Decision, 1)}); err != nil {
							t.Fatal(err)
						}
					}
				}
				now := t0.Add(900 * time.Millisecond)
				reqs := make([]store.Request, 2+rng.IntN(12))
				for i := range reqs {
					c := rng.Int64N(3)
					if rng.IntN(6) == 0 {
						c = rng.Int64N(limit + 3)
					}
					reqs[i] = store.Request{Key: key, Params: &p, Cost: c, Now: now}
				}
				if rng.IntN(4) == 0 {
					// Another key, fresh or exhausted, in the middle.
					o := store.Request{Key: "other" + key, Params: &other, Cost: 1 + rng.Int64N(2), Now: now}
					at := rng.IntN(len(reqs))
					reqs = append(reqs[:at], append([]store.Request{o}, reqs[at:]...)...)
				}
				want := make([]sluice.Decision, len(reqs))
				if err := plain.Do(context.Background(), &store.Batch{Reqs: reqs, Out: want, All: true}); err != nil {
					t.Fatal(err)
				}
				got := make([]sluice.Decision, len(reqs))
				b := store.Batch{Reqs: reqs, Out: got, All: true}
				if mp := mergeAll(new(mergePlan), &b); mp != nil {
					merged++
					if err := doMerged(context.Background(), both, &b, mp, nil); err != nil {
						t.Fatal(err)
					}
				} else if err := both.Do(context.Background(), &b); err != nil {
					t.Fatal(err)
				}
				for i := range reqs {
					compared++
					g, w := got[i], want[i]
					if g != w && a == sluice.SlidingWindowLog && !w.Allowed && w.Reason == sluice.ReasonLimited && w.RetryAfter > 0 && used > 0 {
						// The documented approximation: all but the
						// retry-after must still be exact.
						approx++
						g.RetryAfter = w.RetryAfter
					}
					if g != w {
						t.Fatalf("round %d (limit %d, %d used), request %d of %+v:\n got %+v\nwant %+v", round, limit, used, i, costs(reqs), got[i], want[i])
					}
				}
				// The stores' states must be alike after the batch too.
				read := []store.Request{{Key: key, Params: &p, Now: now}}
				r1, r2 := make([]sluice.Decision, 1), make([]sluice.Decision, 1)
				plain.Do(context.Background(), &store.Batch{Reqs: read, Out: r1})
				both.Do(context.Background(), &store.Batch{Reqs: read, Out: r2})
				if r1[0] != r2[0] {
					t.Fatalf("round %d: state after the batch: merged %+v, unmerged %+v", round, r2[0], r1[0])
				}
			}
			t.Logf("%d batches merged, %d of %d decisions with the approximate retry-after", merged, approx, compared)
			if mergeable(&algorithm.Params{Algorithm: a, Burst: 1}) != (merged > 0) {
				t.Errorf("%d batches merged", merged)
			}
		})
	}
}

func costs(reqs []store.Request) []int64 {
	c := make([]int64, len(reqs))
	for i := range reqs {
		c[i] = reqs[i].Cost
	}
	return c
}

// TestPlanMerge checks which requests an all-or-nothing call sends: a key
// repeated 1,000 times is two requests (the first check's cost and the
// rest up to the capacity), and a read before them when the first check
// reads, in the
// place of its first check; keys of other algorithms, keys repeated under
// other params or instants, and keys that do not repeat go as they are,
// in order.
func TestPlanMerge(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	log := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 100, Window: time.Hour})
	fixed := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Hour})
	high := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 120, Window: time.Hour})
	bucket := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 100, Window: time.Hour})
	var reqs []store.Request
	add := func(key string, p *algorithm.Params, n int, now time.Time) {
		for range n {
			reqs = append(reqs, store.Request{Key: key, Params: p, Cost: 1, Now: now})
		}
	}
	add("alone", &fixed, 1, time.Time{})
	add("log", &log, 1000, time.Time{})
	add("bucket", &bucket, 3, time.Time{})
	add("variants", &fixed, 2, time.Time{})
	add("variants", &high, 1, time.Time{})
	add("instants", &fixed, 1, time.Time{})
	add("instants", &fixed, 1, t0)
	add("log", &log, 10, time.Time{})
	add("fixed", &fixed, 5, time.Time{})
	reqs = append(reqs, store.Request{Key: "reads", Params: &log})
	add("reads", &log, 2, time.Time{})
	p := mergeAll(new(mergePlan), &store.Batch{Reqs: reqs, All: true})
	if p == nil {
		t.Fatal("not merged")
	}
	var got []string
	for _, r := range p.reqs {
		got = append(got, fmt.Sprintf("%s/%d", r.Key, r.Cost))
	}
	want := []string{"alone/1", "log/1", "log/100", "bucket/1", "bucket/1", "bucket/1",
		"variants/1", "variants/1", "variants/1", "instants/1", "instants/1", "fixed/1", "fixed/4",
		"reads/0", "reads/1", "reads/1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests sent:\n got %v\nwant %v", got, want)
	}
	if p := mergeAll(new(mergePlan), &store.Batch{Reqs: reqs[:1]}); p != nil {
		t.Errorf("a call that is not all or nothing merged")
	}
	if p := mergeAll(new(mergePlan), &store.Batch{Reqs: reqs[1001:1009], All: true}); p != nil {
		t.Errorf("a call without a repeated key of a merged algorithm merged: %v", p.reqs)
	}
}
