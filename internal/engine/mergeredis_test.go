package engine

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// maxScriptTime bounds the mean Redis time of the script calls of one
// all-or-nothing batch of checks on one key. Merged, such a batch is at
// most three requests whatever its size, measured at 0.06-0.45ms on a
// loaded machine; the bound leaves room for more load, and is far below
// the 45-90ms that 1,000 sliding window log checks of one key took
// unmerged.
const maxScriptTime = 2 * time.Millisecond

// TestRepeatedKeyBatchRedisTime sends all-or-nothing batches of 1,000
// checks of one key to a real Redis, for a sliding window log and a fixed
// window of 100 an hour, on a fresh key (denied: 1,000 do not fit), then
// batches of 10 until the limit, then 1,000 again on the exhausted key. It
// reads the mean script time per batch from INFO commandstats and checks
// it is within maxScriptTime, and that exactly the limit is admitted.
func TestRepeatedKeyBatchRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p, err := policy.Parse("attack.yaml", []byte(`
version: 1
rules:
  - {id: log, match: {resource: /log}, limit: 100, window: 1h, algorithm: sliding_window_log}
  - {id: fixed, match: {resource: /fixed}, limit: 100, window: 1h, algorithm: fixed_window}
`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Store: st, Local: newStore(t), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	scriptTime := func() (usec, calls int64) { return srv.ScriptStats(t) }
	ctx := context.Background()
	// batches sends n all-or-nothing batches of size checks of res, and
	// returns the mean Redis script time per batch and the checks admitted.
	batches := func(res string, n, size int) (time.Duration, int) {
		batch := make([]Check, size)
		for i := range batch {
			batch[i] = Check{ClientID: "attacker", Resource: res, Cost: 1}
		}
		usec0, _ := scriptTime()
		admitted := 0
		for range n {
			out, err := e.BatchCheck(ctx, batch, AllOrNothing)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range out {
				if r.Allowed {
					admitted++
				}
				if r.Source != SourceStore {
					t.Fatalf("%s: a check decided by %s, want the store", res, r.Source)
				}
			}
		}
		usec, _ := scriptTime()
		return time.Duration(usec-usec0) * time.Microsecond / time.Duration(n), admitted
	}
	for _, res := range []string{"/log", "/fixed"} {
		// The first call loads the scripts.
		if _, err := e.Check(ctx, &Check{ClientID: "warm-up", Resource: res}); err != nil {
			t.Fatal(err)
		}
		// The same batch unmerged, straight to the store, for reference.
		reqs := make([]store.Request, 1000)
		for i := range reqs {
			reqs[i] = store.Request{Key: "unmerged" + res, Params: &p.Rules[0].Base.Params[0], Cost: 1}
			if res == "/fixed" {
				reqs[i].Params = &p.Rules[1].Base.Params[0]
			}
		}
		usec0, _ := scriptTime()
		if err := st.Do(ctx, &store.Batch{Reqs: reqs, Out: make([]sluice.Decision, len(reqs)), All: true}); err != nil {
			t.Fatal(err)
		}
		usec, _ := scriptTime()
		t.Logf("%s: unmerged, a batch of 1,000 checks of one fresh key took %s of Redis time", res, time.Duration(usec-usec0)*time.Microsecond)

		fresh, a1 := batches(res, 20, 1000)
		filling, a2 := batches(res, 10, 10)
		full, a3 := batches(res, 20, 1000)
		t.Logf("%s: Redis time per batch: %s for 1,000 checks of a fresh key, %s for 10 checks admitted, %s for 1,000 checks of an exhausted key",
			res, fresh, filling, full)
		for _, m := range []time.Duration{fresh, filling, full} {
			if m > maxScriptTime {
				t.Errorf("%s: %s of Redis script time per batch, want at most %s", res, m, maxScriptTime)
			}
		}
		if a1+a2+a3 != 100 {
			t.Errorf("%s: %d checks admitted, want the limit, 100", res, a1+a2+a3)
		}
	}
}

// TestAllOrNothingRedisCost logs the Redis time of the all-or-nothing
// calls merging does not shorten, sent straight to the store: 1,000 checks
// (MaxBatch) of distinct keys, and of one key of the algorithms not
// merged, which the engine refuses (TestAtomicBatchWorkBounded). Nothing
// is asserted beyond their being decided: the figures depend on the
// machine.
func TestAllOrNothingRedisCost(t *testing.T) {
	if testing.Short() {
		t.Skip("figures only")
	}
	srv := redistest.Start(t)
	st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	usec := func() int64 { u, _ := srv.ScriptStats(t); return u }
	ctx := context.Background()
	for _, a := range sluice.Algorithms {
		p := algorithm.MustCompile(sluice.Limit{Algorithm: a, Limit: 100, Window: time.Hour})
		for _, distinct := range []bool{true, false} {
			if !distinct && mergeable(&p) {
				continue // measured merged by TestRepeatedKeyBatchRedisTime
			}
			reqs := make([]store.Request, MaxBatch)
			for i := range reqs {
				reqs[i] = store.Request{Key: "cost:" + a.String() + ":" + strconv.FormatBool(distinct), Params: &p, Cost: 1}
				if distinct {
					reqs[i].Key += ":" + strconv.Itoa(i)
				}
			}
			// The first call loads the scripts; the second is measured.
			var per [2]time.Duration
			for k := range per {
				u := usec()
				if err := st.Do(ctx, &store.Batch{Reqs: reqs, Out: make([]sluice.Decision, len(reqs)), All: true}); err != nil {
					t.Fatal(err)
				}
				per[k] = time.Duration(usec()-u) * time.Microsecond
			}
			what := "one key"
			if distinct {
				what = "distinct keys"
			}
			t.Logf("%s: all or nothing, %d checks of %s: %s of Redis time", a, MaxBatch, what, per[1])
		}
	}
}

// TestAtomicBatchWorkBounded: on a real Redis, an all-or-nothing batch
// whose store work is beyond the store's bound (Info().MaxAtomicWork) is
// refused as bad input naming "checks", before anything is sent: 1,000
// checks of distinct sliding window logs (about 100ms of Redis time in one
// call), one more than the bound of distinct fixed windows or logs. The
// largest batches within the bound go as one script call of at most
// maxScriptTime, and 1,000 checks of one key, merged, always go; on the memory store nothing
// is bounded. (Envoy's requests beyond the bound: envoyrls's
// TestAtomicWorkSplitsDescriptors.)
func TestAtomicBatchWorkBounded(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	max := st.Info().MaxAtomicWork
	if max <= 0 {
		t.Fatalf("Info().MaxAtomicWork = %d, want a bound", max)
	}
	p, err := policy.Parse("bound.yaml", []byte(`
version: 1
rules:
  - {id: log, match: {resource: /log}, dimension: user, limit: 100, window: 1h, algorithm: sliding_window_log}
  - {id: fixed, match: {resource: /fixed}, dimension: user, limit: 100, window: 1h, algorithm: fixed_window}
  - {id: biglog, match: {resource: /biglog}, dimension: user, limit: 1000, window: 1h, algorithm: sliding_window_log}
`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Store: st, Local: newStore(t), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	scripts := func() (usec, calls int64) { return srv.ScriptStats(t) }
	ctx := context.Background()
	for _, res := range []string{"/log", "/fixed"} {
		if _, err := e.Check(ctx, &Check{ClientID: "warm-up", User: "w", Resource: res}); err != nil {
			t.Fatal(err)
		}
	}
	logFits := max / store.Work(&store.Request{Params: &p.Rules[0].Base.Params[0], Cost: 1})
	for _, tc := range []struct {
		name  string
		res   string
		n     int
		same  bool // one key
		fits  bool
		allow bool
	}{
		{"1,000 distinct logs", "/log", MaxBatch, false, false, false},
		{"distinct logs, one too many", "/log", logFits + 1, false, false, false},
		{"distinct logs within the bound", "/log", logFits, false, true, true},
		{"distinct fixed windows, one too many", "/fixed", max + 1, false, false, false},
		{"distinct fixed windows within the bound", "/fixed", max, false, true, true},
		{"1,000 checks of one log, merged", "/log", MaxBatch, true, true, false},
		{"1,000 checks of one log of 1,000, merged", "/biglog", MaxBatch, true, true, true},
	} {
		// Batches that fit are sent three times, on new keys, and the
		// least Redis time is kept: Redis counts the time it was
		// descheduled on a busy machine as the script's.
		least := time.Duration(math.MaxInt64)
		for round := range 3 {
			b := make([]Check, tc.n)
			for i := range b {
				b[i] = Check{ClientID: "attacker", User: strconv.Itoa(round) + ":" + strconv.Itoa(i), Resource: tc.res, Cost: 1}
				if tc.same {
					b[i].User = "u" + strconv.Itoa(round)
				}
			}
			usec0, calls0 := scripts()
			out, err := e.BatchCheck(ctx, b, AllOrNothing)
			usec, calls := scripts()
			if !tc.fits {
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Field != "checks" || !errors.Is(err, ErrInvalidCheck) {
					t.Errorf("%s: error %v, want a *FieldError naming checks", tc.name, err)
				}
				if calls != calls0 {
					t.Errorf("%s: %d script calls, want none", tc.name, calls-calls0)
				}
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if calls-calls0 != 1 {
				t.Errorf("%s: %d script calls, want one", tc.name, calls-calls0)
			}
			least = min(least, time.Duration(usec-usec0)*time.Microsecond)
			for i, r := range out {
				if r.Allowed != tc.allow || r.Source != SourceStore {
					t.Fatalf("%s: check %d %+v, want allowed %v by the store", tc.name, i, r, tc.allow)
				}
			}
		}
		if tc.fits {
			t.Logf("%s (%d checks): one script call, %s of Redis time", tc.name, tc.n, least)
			// (A log of 1,000 writes 1,000 entries, as one check of cost
			// 1,000 does: the time of one request, not bounded.)
			if least > maxScriptTime && tc.res != "/biglog" {
				t.Errorf("%s: %s of Redis time, want at most %s", tc.name, least, maxScriptTime)
			}
		}
	}

	// The memory store bounds nothing.
	m, err := New(Config{Store: newStore(t), Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	b := make([]Check, MaxBatch)
	for i := range b {
		b[i] = Check{ClientID: "attacker", User: strconv.Itoa(i), Resource: "/log", Cost: 1}
	}
	if _, err := m.BatchCheck(ctx, b, AllOrNothing); err != nil {
		t.Errorf("memory store: %v, want 1,000 distinct logs decided", err)
	}
}
