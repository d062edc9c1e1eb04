package guard

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// BenchmarkLayers measures what each piece of the guard buys, in one run
// on one redis-server started by the benchmark: 64 callers send single
// checks over 10,000 keys, first to the Redis store alone (whose client
// pipelines concurrent calls on its own), then through a guard that adds
// one piece at a time: the deadline (a goroutine per store call), the
// breaker, gathering, the over-limit cache, the hot-key tier.
//
// Two workloads: uniform (every key alike, far below its limit: what each
// piece costs when it has nothing to do) and skewed (Zipf, s = 1.1, a limit
// of 1,000 per second per key: the head keys are hot and over their limit,
// which is what the cache and the hot-key tier are for).
//
// Besides checks/s it reports this process's CPU per check (client-µs,
// getrusage), Redis's CPU per check (redis-µs, INFO cpu) and Redis
// commands per check (redis-cmds, INFO commandstats): the CPU figures are
// stable where checks/s is not on a shared machine.
func BenchmarkLayers(b *testing.B) {
	srv := redistest.Start(b)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "rl:layers:{" + strconv.Itoa(i) + "}"
	}
	workloads := []struct {
		name string
		p    *algorithm.Params
		next func(seed uint64) func() string
	}{
		{"uniform", params(b, sluice.Limit{Algorithm: sluice.GCRA, Limit: 1 << 30, Window: time.Second}),
			func(seed uint64) func() string {
				i := seed * 7919
				return func() string { i += 7919; return keys[i%uint64(len(keys))] }
			}},
		{"skewed", params(b, sluice.Limit{Algorithm: sluice.GCRA, Limit: 1000, Window: time.Second}),
			func(seed uint64) func() string {
				z := rand.NewZipf(rand.New(rand.NewPCG(seed, 1)), 1.1, 1, uint64(len(keys)-1))
				return func() string { return keys[z.Uint64()] }
			}},
	}
	// Each layer adds one piece to the one before it.
	off := Config{Deadline: time.Second, Gatherers: -1, Breaker: BreakerConfig{Disabled: true}, OverLimit: OverLimitConfig{Disabled: true}}
	layers := []struct {
		name string
		cfg  func(*Config)
	}{
		{"store", nil},
		{"deadline", func(*Config) {}},
		{"breaker", func(c *Config) { c.Breaker.Disabled = false }},
		{"gather", func(c *Config) { c.Gatherers = 0 }},
		{"overlimit", func(c *Config) { c.OverLimit.Disabled = false }},
		{"hotkeys", func(c *Config) { c.HotKeys.Enabled = true }},
	}
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			cfg := off
			for _, l := range layers {
				if l.cfg != nil {
					l.cfg(&cfg)
				}
				layerCfg := cfg
				b.Run(l.name, func(b *testing.B) {
					st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { st.Close() })
					var s Store = st
					if l.cfg != nil {
						s = newGuard(b, st, layerCfg)
					}
					benchLayer(b, srv, s, w.p, w.next)
				})
			}
		})
	}
}

// benchLayer runs 64 callers checking keys from next through s, and
// reports checks/s and the CPU and Redis commands per check.
func benchLayer(b *testing.B, srv *redistest.Server, s Store, p *algorithm.Params, next func(seed uint64) func() string) {
	var seeds atomic.Uint64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	client, redisCPU, cmds := selfCPU(b), serverCPU(b, srv), serverCommands(b, srv)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		key := next(seeds.Add(1))
		reqs := make([]store.Request, 1)
		out := make([]sluice.Decision, 1)
		bt := store.Batch{Reqs: reqs, Out: out}
		for pb.Next() {
			reqs[0] = store.Request{Key: key(), Params: p, Cost: 1}
			if err := s.Do(context.Background(), &bt); err != nil {
				b.Error(err)
				return
			}
		}
	})
	elapsed := time.Since(start)
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "checks/s")
	b.ReportMetric(float64(selfCPU(b)-client)/float64(time.Microsecond)/n, "client-µs/check")
	b.ReportMetric(float64(serverCPU(b, srv)-redisCPU)/float64(time.Microsecond)/n, "redis-µs/check")
	b.ReportMetric(float64(serverCommands(b, srv)-cmds)/n, "redis-cmds/check")
	b.ReportMetric(0, "ns/op") // checks/s says it, for 64 callers
}

// selfCPU returns this process's CPU time so far, user and system.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU returns srv's CPU time so far, user and system (INFO cpu).
func serverCPU(b *testing.B, srv *redistest.Server) time.Duration {
	info, err := srv.Info("cpu")
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info[k], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", k, err)
		}
		sum += v
	}
	return time.Duration(sum * float64(time.Second))
}

// serverCommands returns the commands srv has run so far, INFO left out
// (INFO commandstats).
func serverCommands(b *testing.B, srv *redistest.Server) int64 {
	info, err := srv.Info("commandstats")
	if err != nil {
		b.Fatal(err)
	}
	var sum int64
	for k, v := range info {
		if !strings.HasPrefix(k, "cmdstat_") || k == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			b.Fatalf("INFO commandstats %s: %q", k, v)
		}
		sum += c
	}
	return sum
}
