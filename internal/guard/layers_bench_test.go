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
// Three workloads, all on a sliding window counter: uniform (every key
// alike, far below its limit of 2^30 a minute: what each piece costs when
// it has nothing to do); zipf (keys drawn with Zipf's law, s = 1.1, far
// below the same limit: the head keys are hot, which is what the hot-key
// tier is for); zipf-over (the same keys, 100 checks per second per key:
// the head keys are over their limit, which is what the over-limit cache
// is for).
//
// Besides checks/s it reports this process's CPU per check (client-µs,
// getrusage), Redis's CPU per check (redis-µs, INFO cpu) and the script
// calls (EVALSHA) Redis ran per check (redis-calls, INFO commandstats)
// and the share of checks answered in process: the CPU figures are stable
// where checks/s is not on a shared machine.
func BenchmarkLayers(b *testing.B) {
	srv := redistest.Start(b)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "rl:layers:{" + strconv.Itoa(i) + "}"
	}
	uniform := func(seed uint64) func() string {
		i := seed * 7919
		return func() string { i += 7919; return keys[i%uint64(len(keys))] }
	}
	zipf := func(seed uint64) func() string {
		z := rand.NewZipf(rand.New(rand.NewPCG(seed, 1)), 1.1, 1, uint64(len(keys)-1))
		return func() string { return keys[z.Uint64()] }
	}
	high := params(b, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 1 << 30, Window: time.Minute})
	workloads := []struct {
		name string
		p    *algorithm.Params
		next func(seed uint64) func() string
	}{
		{"uniform", high, uniform},
		{"zipf", high, zipf},
		{"zipf-over", params(b, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 100, Window: time.Second}), zipf},
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
// reports checks/s, the CPU per check, the script calls per check and the
// share of checks answered in process (by the over-limit cache or a hot
// key's lease).
func benchLayer(b *testing.B, srv *redistest.Server, s Store, p *algorithm.Params, next func(seed uint64) func() string) {
	var seeds, local atomic.Uint64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	client, redisCPU, calls := selfCPU(b), serverCPU(b, srv), scriptCalls(b, srv)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		key := next(seeds.Add(1))
		reqs := make([]store.Request, 1)
		out := make([]sluice.Decision, 1)
		bt := store.Batch{Reqs: reqs, Out: out, Sources: make([]store.Source, 1)}
		var n uint64
		for pb.Next() {
			reqs[0] = store.Request{Key: key(), Params: p, Cost: 1}
			if err := s.Do(context.Background(), &bt); err != nil {
				b.Error(err)
				return
			}
			if bt.Sources[0] != store.SourceStore {
				n++
			}
		}
		local.Add(n)
	})
	elapsed := time.Since(start)
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "checks/s")
	b.ReportMetric(float64(selfCPU(b)-client)/float64(time.Microsecond)/n, "client-µs/check")
	b.ReportMetric(float64(serverCPU(b, srv)-redisCPU)/float64(time.Microsecond)/n, "redis-µs/check")
	b.ReportMetric(float64(scriptCalls(b, srv)-calls)/n, "redis-calls/check")
	b.ReportMetric(100*float64(local.Load())/n, "%in-process")
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

// scriptCalls returns the script calls (EVAL, EVALSHA, FCALL and their
// read-only forms) srv has run so far (INFO commandstats), not the
// commands the scripts themselves run.
func scriptCalls(b *testing.B, srv *redistest.Server) int64 {
	info, err := srv.Info("commandstats")
	if err != nil {
		b.Fatal(err)
	}
	var sum int64
	for k, v := range info {
		if !strings.HasPrefix(k, "cmdstat_eval") && !strings.HasPrefix(k, "cmdstat_fcall") {
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
