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
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Store is what the suite runs: the one interface of package store.
type Store = store.Store

// do decides reqs through s.Do, as one unit when all.
func do(ctx context.Context, s Store, all bool, reqs []store.Request, out []sluice.Decision) error {
	return s.Do(ctx, &store.Batch{Reqs: reqs, Out: out, All: all})
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

// Run runs the suite, through Store.Do, Reset and Info alone. newStore returns a store for one subtest; stores may
// share their state (a Redis server), as the suite's keys never repeat
// across calls of Run.
//
// What Info states is checked too: a store that decides in parts
// (Info.Parts) reports every request of a batch to Batch.Part once; a store
// that keeps idempotency records (Info.SharedRecords) replays a repeated
// Batch.Once without deciding it, and any other store ignores Batch.Once
// and decides each call anew. The records a process keeps for a store
// without them are the engine's, and internal/engine tests them.
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
	t.Run("After", func(t *testing.T) { testAfter(t, newStore(t), key) })
	t.Run("AfterStoreClock", func(t *testing.T) { testAfterStoreClock(t, newStore(t), key) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, newStore(t), key) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newStore(t), key) })
	t.Run("Sources", func(t *testing.T) { testSources(t, newStore(t), key) })
	t.Run("Parts", func(t *testing.T) { testParts(t, newStore(t), key) })
	t.Run("Once", func(t *testing.T) { testOnce(t, newStore(t), key) })
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
	if err := do(context.Background(), s, false, []store.Request{r}, out); err != nil {
		t.Fatalf("Check(%s cost %d): %v", r.Key, r.Cost, err)
	}
	return out[0]
}

// decideOne decides r alone through CheckAll (all) or Check, and returns
// the store's decision and the model's.
func decideOne(s Store, m *Model, r store.Request, all bool) (got, want sluice.Decision, err error) {
	out := make([]sluice.Decision, 1)
	if all {
		err = do(context.Background(), s, true, []store.Request{r}, out)
		return out[0], m.DecideAll([]store.Request{r})[0], err
	}
	err = do(context.Background(), s, false, []store.Request{r}, out)
	return out[0], m.Decide(r), err
}

// step is one request of a sequence: dt after the previous one.
type step struct {
	dt   time.Duration
	cost int64
}
