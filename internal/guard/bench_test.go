package guard

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// BenchmarkGuard measures what the guard adds to a store call, on the
// memory store (which answers in about a microsecond, so the guard's own
// cost shows): direct is the store alone, guard the store through a guard
// with its defaults (deadline, breaker, over-limit cache), cached a check
// answered by the over-limit cache.
func BenchmarkGuard(b *testing.B) {
	inner := newMemory(b, nil)
	p := params(b, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 1 << 40, Window: time.Minute})
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "rl:bench:{" + strconv.Itoa(i) + "}"
	}
	b.Run("direct", func(b *testing.B) {
		reqs := make([]store.Request, 1)
		out := make([]sluice.Decision, 1)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			reqs[0] = store.Request{Key: keys[i%len(keys)], Params: p, Cost: 1}
			if err := inner.CheckAll(context.Background(), reqs, out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guard", func(b *testing.B) {
		g := newGuard(b, inner, Config{Deadline: time.Second})
		reqs := make([]store.Request, 1)
		out := make([]sluice.Decision, 1)
		b1 := store.Batch{Out: out, Sources: make([]store.Source, 1)}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			reqs[0] = store.Request{Key: keys[i%len(keys)], Params: p, Cost: 1}
			if err := g.Do(context.Background(), batch(&b1, reqs, true)); err != nil {
				b.Fatal(err)
			}
		}
	})
	// 64 concurrent callers, their store calls gathered (the default) or
	// one call each.
	benchParallel64(b, func(b *testing.B) Store { return inner }, keys, p)
	b.Run("cached", func(b *testing.B) {
		g := newGuard(b, inner, Config{Deadline: time.Second})
		tight := params(b, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Hour})
		reqs := []store.Request{{Key: "rl:bench:tight", Params: tight, Cost: 1}}
		out := make([]sluice.Decision, 1)
		b1 := store.Batch{Out: out, Sources: make([]store.Source, 1)}
		g.Do(context.Background(), batch(&b1, reqs, true))
		g.Do(context.Background(), batch(&b1, reqs, true))
		b.ReportAllocs()
		for b.Loop() {
			if err := g.Do(context.Background(), batch(&b1, reqs, true)); err != nil || b1.Sources[0] != store.SourceOverLimitCache {
				b.Fatal(err, b1.Sources[0])
			}
		}
	})
}

// BenchmarkGuardRedis is BenchmarkGuard's parallel run on a real
// redis-server (started by the benchmark, no persistence): 64 callers,
// their checks gathered (the default) or one store call each. It reports
// checks/s and the mean checks per gathered call.
func BenchmarkGuardRedis(b *testing.B) {
	srv := redistest.Start(b)
	p := params(b, sluice.Limit{Algorithm: sluice.GCRA, Limit: 1 << 30, Window: time.Second})
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "rl:bench:{" + strconv.Itoa(i) + "}"
	}
	benchParallel64(b, func(b *testing.B) Store {
		st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	}, keys, p)
}

// BenchmarkGuardRedisCluster is BenchmarkGuardRedis on a 3-master Redis
// Cluster: a gathered call's checks are split per master, and each
// master's are reported as it answers.
func BenchmarkGuardRedisCluster(b *testing.B) {
	c := redistest.StartCluster(b, redistest.ClusterOptions{})
	p := params(b, sluice.Limit{Algorithm: sluice.GCRA, Limit: 1 << 30, Window: time.Second})
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "rl:bench:{" + strconv.Itoa(i) + "}"
	}
	benchParallel64(b, func(b *testing.B) Store {
		st, err := redis.New(redis.Config{Addrs: c.Addrs()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	}, keys, p)
}

// benchParallel64 runs 64 concurrent callers checking keys (with a
// stride, so that concurrent checks rarely share one) through a guard on
// the store newStore returns, their checks gathered (the default) and one
// store call each, and reports checks/s and the mean checks per gathered
// call.
func benchParallel64(b *testing.B, newStore func(*testing.B) Store, keys []string, p *algorithm.Params) {
	for _, gatherers := range []int{DefaultGatherers, -1} {
		name := "parallel-64/gathered"
		if gatherers < 0 {
			name = "parallel-64/call-each"
		}
		b.Run(name, func(b *testing.B) {
			g := newGuard(b, newStore(b), Config{Deadline: time.Second, Gatherers: gatherers})
			var next atomic.Int64
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				reqs := make([]store.Request, 1)
				out := make([]sluice.Decision, 1)
				b1 := store.Batch{Out: out, Sources: make([]store.Source, 1)}
				for pb.Next() {
					reqs[0] = store.Request{Key: keys[next.Add(7919)%int64(len(keys))], Params: p, Cost: 1}
					if err := g.Do(context.Background(), batch(&b1, reqs, false)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "checks/s")
			if st := g.Stats(); st.GatheredCalls > 0 {
				b.ReportMetric(float64(st.GatheredJobs)/float64(st.GatheredCalls), "checks/call")
			}
		})
	}
}

// batch sets b up for a call of reqs, as one unit when all.
func batch(b *store.Batch, reqs []store.Request, all bool) *store.Batch {
	b.Reqs, b.All = reqs, all
	return b
}
