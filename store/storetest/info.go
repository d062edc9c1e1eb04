package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// This file checks the optional parts of a Batch against what the store's
// Info states: sources, parts and idempotency records.

// testSources checks that a store reports itself as the source of every
// decision, in both modes.
func testSources(t *testing.T, s Store, key keyFunc) {
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Minute})
	reqs := []store.Request{
		{Key: key(t, "a"), Params: p, Cost: 1, Now: T0},
		{Key: key(t, "b"), Params: p, Cost: 1, Now: T0},
	}
	for _, all := range []bool{false, true} {
		src := []store.Source{store.SourceHotKey, store.SourceOverLimitCache}
		b := store.Batch{Reqs: reqs, Out: make([]sluice.Decision, len(reqs)), All: all, Sources: src}
		if err := s.Do(context.Background(), &b); err != nil {
			t.Fatalf("Do(all %v): %v", all, err)
		}
		for i, got := range src {
			if got != store.SourceStore {
				t.Errorf("all %v: Sources[%d] = %d, want SourceStore", all, i, got)
			}
		}
	}
}

// testParts checks, on a store that decides in parts, that every request
// of a batch is reported to Batch.Part once, decided as the model decides
// it.
func testParts(t *testing.T, s Store, key keyFunc) {
	if !s.Info().Parts {
		t.Skip("the store does not decide in parts")
	}
	p := compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 2, Window: time.Minute})
	var reqs []store.Request
	for _, name := range []string{"a", "b", "c", "a", "d", "a"} {
		reqs = append(reqs, store.Request{Key: key(t, name), Params: p, Cost: 1, Now: T0})
	}
	m := NewModel()
	want := make([]sluice.Decision, len(reqs))
	for i, r := range reqs {
		want[i] = m.Decide(r)
	}
	seen := make([]int, len(reqs))
	b := store.Batch{Reqs: reqs, Out: make([]sluice.Decision, len(reqs)), Part: func(idx []int, err error) {
		if err != nil {
			t.Errorf("part %v: %v", idx, err)
		}
		for _, i := range idx {
			seen[i]++
		}
	}}
	if err := s.Do(context.Background(), &b); err != nil {
		t.Fatalf("Do: %v", err)
	}
	for i := range reqs {
		if seen[i] != 1 {
			t.Errorf("request %d reported %d times, want once", i, seen[i])
		}
		if b.Out[i] != want[i] {
			t.Errorf("request %d (%s): got %+v, want %+v", i, reqs[i].Key, b.Out[i], want[i])
		}
	}
}

// testOnce checks Batch.Once: a store that keeps records (Info's
// SharedRecords) decides a key's first batch, replays its decisions for a
// repeat without charging, and decides another key anew; any other store
// ignores the record and decides every call.
func testOnce(t *testing.T, s Store, key keyFunc) {
	shared := s.Info().SharedRecords
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Minute})
	cases := map[string][]string{
		"OneKey":   {"one"},
		"TwoKeys":  {"a", "b"}, // two slots of a cluster
		"SameKeys": {"c", "c"},
	}
	for name, keys := range cases {
		t.Run(name, func(t *testing.T) {
			var reqs []store.Request
			for _, k := range keys {
				reqs = append(reqs, store.Request{Key: key(t, k), Params: p, Cost: 1, Now: T0})
			}
			m := NewModel()
			do := func(idem string) (*store.Batch, []sluice.Decision) {
				t.Helper()
				b := &store.Batch{Reqs: reqs, Out: make([]sluice.Decision, len(reqs)), All: true,
					Once: &store.Once{Key: key(t, idem), TTL: time.Minute}}
				if err := s.Do(context.Background(), b); err != nil {
					t.Fatalf("Do(once %s): %v", idem, err)
				}
				return b, b.Out
			}
			first, got := do("first")
			if want := m.DecideAll(reqs); first.Once.Replayed || !slices.Equal(got, want) {
				t.Fatalf("first: replayed %v, got %+v; want decided, %+v", first.Once.Replayed, got, want)
			}
			repeat, again := do("first")
			if shared {
				if !repeat.Once.Replayed || !slices.Equal(again, got) {
					t.Fatalf("repeat: replayed %v, got %+v; want replayed, %+v", repeat.Once.Replayed, again, got)
				}
			} else if want := m.DecideAll(reqs); repeat.Once.Replayed || !slices.Equal(again, want) {
				t.Fatalf("repeat without records: replayed %v, got %+v; want decided anew, %+v", repeat.Once.Replayed, again, want)
			}
			other, next := do("other")
			if want := m.DecideAll(reqs); other.Once.Replayed || !slices.Equal(next, want) {
				t.Fatalf("another key: replayed %v, got %+v; want decided, %+v", other.Once.Replayed, next, want)
			}
		})
	}
}
