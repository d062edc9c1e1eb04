package guard_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// batchPolicy limits the attacker's client to 100 per hour, and leaves
// the other clients' rule far from its limit.
const batchPolicy = `version: 1
rules:
  - { id: attack, match: { resource: /attack }, dimension: client, algorithm: sliding_window_log, limit: 100, window: 1h }
  - { id: other,  match: { resource: /other },  dimension: client, limit: 1000000000, window: 1h }
`

// TestBatchAttackerBounded: one client sends all-or-nothing batches of
// checks of its own key back to back (of 50 checks, and of 1,000), with
// default settings, on a real Redis, while other clients check. It is
// admitted at most its limit (no batch misses the deadline, and one that
// would be decided by its rule's local share), and its batches hold Redis
// for well under a millisecond each (the Redis store sends the requests
// of one key once). The other clients' p99 is logged beside the same checks'
// without the attacker: in this test the attacker runs in the same
// process, and under -race its planning of 1,000 checks takes the CPU the
// others' checks need, which no bound on Redis changes.
func TestBatchAttackerBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: two phases of load on Redis")
	}
	srv := redistest.Start(t)
	eng, g := newFaultEngine(t, newRedisStore(t, srv.Addr), batchPolicy, guard.Config{})
	for decided, deadline := 0, time.Now().Add(warmUpFor); decided < 30; {
		if time.Now().After(deadline) {
			t.Fatalf("warm-up: the store decided %d checks in %s", decided, warmUpFor)
		}
		c := engine.Check{ClientID: "other", Resource: "/other", Cost: 1}
		if r, err := eng.Check(context.Background(), &c); err == nil && r.Source == engine.SourceStore {
			decided++
		}
	}
	others := func(w, i int) engine.Check {
		return engine.Check{ClientID: "other", Resource: "/other", Cost: 1}
	}
	const phase = 1500 * time.Millisecond
	evalUsec := func() int64 {
		info, err := srv.Info("commandstats")
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for name, v := range info {
			if !strings.HasPrefix(name, "cmdstat_eval") && !strings.HasPrefix(name, "cmdstat_fcall") {
				continue
			}
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "usec="); ok {
					u, _ := strconv.ParseInt(n, 10, 64)
					total += u
				}
			}
		}
		return total
	}
	run := func(attack int) (p99 time.Duration, admitted, batches int64) {
		var stop atomic.Bool
		var wg sync.WaitGroup
		if attack > 0 {
			batch := make([]engine.Check, attack)
			for i := range batch {
				batch[i] = engine.Check{ClientID: "attacker", Resource: "/attack", Cost: 1}
			}
			wg.Go(func() {
				for !stop.Load() {
					out, err := eng.BatchCheck(context.Background(), batch, engine.AllOrNothing)
					if err != nil {
						t.Error(err)
						return
					}
					batches++
					for _, r := range out {
						if r.Allowed {
							admitted++
						}
					}
				}
			})
		}
		l := startLoad(eng, 4, time.Millisecond, others)
		time.Sleep(phase)
		ss := l.stop()
		stop.Store(true)
		wg.Wait()
		for _, s := range ss {
			if s.err != nil || s.res.Source != engine.SourceStore {
				t.Fatalf("another client's check: %+v, %v; want decided by the store", s.res, s.err)
			}
		}
		_, p99, _ = latencies(ss)
		return p99, admitted, batches
	}
	// perBatch measures the Redis script time of the attacker's batches
	// alone, with no other client checking: under -race on a busy machine
	// the attacker sends few batches while the others send thousands of
	// checks, whose time would swamp the figure.
	perBatch := func(size int) time.Duration {
		batch := make([]engine.Check, size)
		for i := range batch {
			batch[i] = engine.Check{ClientID: "attacker", Resource: "/attack", Cost: 1}
		}
		const n = 20
		before := evalUsec()
		for range n {
			if _, err := eng.BatchCheck(context.Background(), batch, engine.AllOrNothing); err != nil {
				t.Fatal(err)
			}
		}
		return time.Duration(evalUsec()-before) * time.Microsecond / n
	}
	for _, size := range []int{50, 1000} {
		ref, _, _ := run(0)
		p99, admitted, batches := run(size)
		perBatch := perBatch(size)
		t.Logf("batches of %d: %d sent, %d checks admitted; Redis script time per batch %s (alone); other clients' p99 %s (without the attacker %s)",
			size, batches, admitted, perBatch, p99, ref)
		if admitted > 100 {
			t.Errorf("batches of %d: %d checks admitted, want at most the limit, 100", size, admitted)
		}
		if perBatch > time.Millisecond {
			t.Errorf("batches of %d: Redis spent %s per batch, want at most 1 ms (one request per key)", size, perBatch)
		}
		if n := g.Stats().StoreErrors; n != 0 {
			t.Errorf("%d store errors", n)
		}
		if _, err := srv.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
	}
}
