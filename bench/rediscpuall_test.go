package bench

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	sluiceredis "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// BenchmarkRedisCPUAll reports what a check of one limit and a check of
// two limits (an all-or-nothing store.Batch of two requests) cost Redis,
// one store call per check as the engine makes them without the guard: the
// Redis server's CPU per check (INFO cpu) and the time Redis spent in the
// script calls per check (INFO commandstats, usec of evalsha and eval).
// one is a sliding window counter (the policy's default algorithm); two
// adds a fixed window on another key; global is two with the fixed window
// at an explicit instant, as the engine sends a global limit. Run it with
// a fixed number of checks:
//
//	cd bench && go test -run '^$' -bench RedisCPUAll -benchtime 60000x
func BenchmarkRedisCPUAll(b *testing.B) {
	srv := redistest.Start(b)
	s, err := sluiceredis.New(sluiceredis.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	counter := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: cpuLimit, Window: time.Minute})
	fixed := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: cpuLimit, Window: time.Minute})
	for _, bc := range []struct {
		name string
		reqs func(k string) []store.Request
	}{
		{"one", func(k string) []store.Request {
			return []store.Request{{Key: "{" + k + "}:a", Params: &counter, Cost: 1}}
		}},
		{"two", func(k string) []store.Request {
			return []store.Request{{Key: "{" + k + "}:a", Params: &counter, Cost: 1}, {Key: "{" + k + "}:b", Params: &fixed, Cost: 1}}
		}},
		{"global", func(k string) []store.Request {
			return []store.Request{{Key: "{" + k + "}:a", Params: &counter, Cost: 1}, {Key: "{" + k + "}:g", Params: &fixed, Cost: 1, Now: time.Now()}}
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			redisCPUPerCall(b, srv, func(ctx context.Context, key string) error {
				reqs := bc.reqs(key)
				out := make([]sluice.Decision, len(reqs))
				return s.Do(ctx, &store.Batch{Reqs: reqs, Out: out, All: len(reqs) > 1})
			})
		})
	}
}

// redisCPUPerCall makes b.N calls of call, from cpuCallers goroutines,
// each on a key drawn at random from redisKeyNames, and reports the Redis
// server's CPU and script time per call and the calls per second.
func redisCPUPerCall(b *testing.B, srv *redistest.Server, call func(ctx context.Context, key string) error) {
	ctx := context.Background()
	var next atomic.Int64
	cpu0, usec0 := redisCPUTime(b, srv), redisScriptUsec(b, srv)
	start := time.Now()
	var wg sync.WaitGroup
	for g := range cpuCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for next.Add(1) <= int64(b.N) {
				if err := call(ctx, redisKeyNames[rng.IntN(redisKeys)]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := redisCPUTime(b, srv) - cpu0
	usec := redisScriptUsec(b, srv) - usec0
	b.ReportMetric(cpu.Seconds()*1e6/float64(b.N), "redis-cpu-µs/check")
	b.ReportMetric(usec/float64(b.N), "script-µs/check")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
	b.ReportMetric(0, "ns/op")
}

// redisScriptUsec returns the time, in µs, Redis has spent in script calls
// (INFO commandstats: the usec of evalsha and eval).
func redisScriptUsec(b *testing.B, srv *redistest.Server) float64 {
	info, err := srv.Info("commandstats")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, cmd := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		for _, f := range strings.Split(info[cmd], ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("INFO commandstats %s: %q", cmd, info[cmd])
				}
				total += n
			}
		}
	}
	return total
}
