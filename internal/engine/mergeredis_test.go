package engine

import (
	"context"
	"strconv"
	"strings"
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
	// scriptTime returns the Redis time and number of the script calls.
	scriptTime := func() (usec, calls int64) {
		info, err := srv.Info("commandstats")
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range info {
			if !strings.HasPrefix(name, "cmdstat_eval") {
				continue
			}
			for _, f := range strings.Split(v, ",") {
				k, n, _ := strings.Cut(f, "=")
				x, _ := strconv.ParseInt(n, 10, 64)
				switch k {
				case "usec":
					usec += x
				case "calls":
					calls += x
				}
			}
		}
		return usec, calls
	}
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
// calls merging does not shorten, for docs/api.md: 1,000 checks (MaxBatch)
// of distinct keys, and of one key of the algorithms not merged. Nothing
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
	usec := func() int64 {
		info, err := srv.Info("commandstats")
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for name, v := range info {
			if strings.HasPrefix(name, "cmdstat_eval") {
				for _, f := range strings.Split(v, ",") {
					if n, ok := strings.CutPrefix(f, "usec="); ok {
						x, _ := strconv.ParseInt(n, 10, 64)
						total += x
					}
				}
			}
		}
		return total
	}
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
