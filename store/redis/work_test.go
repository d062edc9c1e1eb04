package redis

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// maxCallTime bounds the mean Redis time of one script call of a batch
// decided request by request. A call takes at most maxCallWork of work,
// measured at 0.1-0.6ms; the bound leaves room for a loaded machine.
const maxCallTime = 2 * time.Millisecond

// TestCheckCallWorkBounded sends Checks of many requests (2,000 fixed
// windows, 256 sliding window logs of cost 100, 2,000 logs of cost 1) and
// checks, from INFO commandstats, that they went as several script calls,
// each within maxCallTime of Redis time on average, and were decided
// (with ScriptsOnly: plain commands are each a few microseconds, and Redis
// serves its other clients between the reads of a long pipeline).
func TestCheckCallWorkBounded(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, ScriptsOnly: true})
	fixed := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Hour})
	log := compile(t, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 100, Window: time.Hour})
	scriptStats := func() (usec, calls int64) { return srv.ScriptStats(t) }
	ctx := context.Background()
	// Load the scripts.
	warm := []store.Request{{Key: "warm:0", Params: fixed, Cost: 1}, {Key: "warm:1", Params: log, Cost: 1}, {Key: "warm:2", Params: fixed, Cost: 1}}
	if err := s.Check(ctx, warm, make([]sluice.Decision, len(warm))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		n        int
		cost     int64
		minCalls int64
	}{
		{"fixed windows", 2000, 1, 2000 / maxCallWork},
		{"logs of cost 100", 256, 100, 256},
		{"logs of cost 1", 2000, 1, int64(2000 / (maxCallWork / store.Work(&store.Request{Params: log, Cost: 1})))},
	} {
		p := fixed
		if strings.HasPrefix(tc.name, "logs") {
			p = log
		}
		reqs := make([]store.Request, tc.n)
		for i := range reqs {
			reqs[i] = store.Request{Key: "work:" + tc.name + ":" + strconv.Itoa(i), Params: p, Cost: tc.cost}
		}
		out := make([]sluice.Decision, len(reqs))
		usec0, calls0 := scriptStats()
		if err := s.Check(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		usec, calls := scriptStats()
		calls -= calls0
		per := time.Duration(usec-usec0) * time.Microsecond / time.Duration(max(calls, 1))
		t.Logf("%d %s: %d script calls, %s of Redis time each", tc.n, tc.name, calls, per)
		if calls < tc.minCalls {
			t.Errorf("%d %s: %d script calls, want at least %d", tc.n, tc.name, calls, tc.minCalls)
		}
		if per > maxCallTime {
			t.Errorf("%d %s: %s of Redis time per call, want at most %s", tc.n, tc.name, per, maxCallTime)
		}
		for i, d := range out {
			if !d.Allowed || d.Remaining != 100-tc.cost {
				t.Fatalf("%s request %d: %+v, want allowed with %d remaining", tc.name, i, d, 100-tc.cost)
			}
		}
	}
}

// TestAtomicWorkBounded sends all-or-nothing batches of distinct keys
// holding maxAtomicWork of work (Info().MaxAtomicWork), of every algorithm
// and of sliding window logs of cost 1 and 10, and checks from INFO
// commandstats that each is one script call within maxCallTime of Redis
// time, and is decided.
func TestAtomicWorkBounded(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	if got := s.Info().MaxAtomicWork; got != maxAtomicWork {
		t.Fatalf("Info().MaxAtomicWork = %d, want %d", got, maxAtomicWork)
	}
	scriptTime := func() (usec, calls int64) { return srv.ScriptStats(t) }
	ctx := context.Background()
	type batch struct {
		name string
		alg  sluice.Algorithm
		cost int64
	}
	var batches []batch
	for _, a := range sluice.Algorithms {
		batches = append(batches, batch{a.String(), a, 1})
	}
	batches = append(batches, batch{"sliding_window_log of cost 10", sluice.SlidingWindowLog, 10})
	for _, b := range batches {
		p := compile(t, sluice.Limit{Algorithm: b.alg, Limit: 10000, Window: time.Hour})
		one := store.Work(&store.Request{Params: p, Cost: b.cost})
		reqs := make([]store.Request, maxAtomicWork/one)
		for i := range reqs {
			reqs[i] = store.Request{Key: "atomic:" + b.name + ":" + strconv.Itoa(i), Params: p, Cost: b.cost}
		}
		out := make([]sluice.Decision, len(reqs))
		// The first call loads the scripts; the next 10 are measured.
		if err := s.CheckAll(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		// The least mean of 3 rounds of 10 calls: Redis counts the time
		// it was descheduled on a busy machine as the script's.
		const rounds = 10
		per := time.Duration(math.MaxInt64)
		for range 3 {
			usec0, calls0 := scriptTime()
			for range rounds {
				if err := s.CheckAll(ctx, reqs, out); err != nil {
					t.Fatal(err)
				}
			}
			usec, calls := scriptTime()
			if calls-calls0 != rounds {
				t.Errorf("%s: %d script calls for %d batches, want one each", b.name, calls-calls0, rounds)
			}
			per = min(per, time.Duration(usec-usec0)*time.Microsecond/rounds)
		}
		t.Logf("%d requests of %s (work %d): %s of Redis time per batch", len(reqs), b.name, len(reqs)*one, per)
		if per > maxCallTime {
			t.Errorf("%s: %s of Redis time per batch, want at most %s", b.name, per, maxCallTime)
		}
		for i, d := range out {
			if !d.Allowed {
				t.Fatalf("%s request %d: %+v, want allowed", b.name, i, d)
			}
		}
	}
}
