package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	sluiceredis "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// The Redis benchmarks: 64 goroutines in one process check keys of one
// local redis-server (started by the benchmark, no persistence), each check
// one round trip. The limit is high enough that nearly every check is
// admitted, so every check writes.
const (
	redisGoroutines = 64
	redisKeys       = 10_000
	redisLimit      = 10_000 // per second, per key
)

var redisKeyNames = func() []string {
	k := make([]string, redisKeys)
	for i := range k {
		k[i] = "rl:bench:{user=" + strconv.Itoa(i) + "}"
	}
	return k
}()

// runParallel64 runs check from 64 goroutines, each walking the keys from
// its own offset, and reports checks/s and the p50 and p99 latency of one
// check.
func runParallel64(b *testing.B, check func(ctx context.Context, key string) error) {
	ctx := context.Background()
	var next atomic.Uint64
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(max(1, redisGoroutines/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919)) // spread the goroutines over the keys
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			t := time.Now()
			if err := check(ctx, redisKeyNames[i%redisKeys]); err != nil {
				b.Error(err)
				return
			}
			local = append(local, time.Since(t))
			i++
		}
		mu.Lock()
		lat = append(lat, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

// BenchmarkRedis measures Sluice's Redis store, per algorithm, on the
// Redis server's clock; and, for the record, the ceiling redis-benchmark
// reaches with the same script on the same server (ceiling-P16).
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	// GCRA first and the ceiling right after it, so that the figures
	// compared in docs/PERFORMANCE.md are measured close together.
	algs := []sluice.Algorithm{sluice.GCRA}
	for _, a := range sluice.Algorithms {
		if a != sluice.GCRA {
			algs = append(algs, a)
		}
	}
	for i, a := range algs {
		if i == 1 {
			b.Run("ceiling-P16", func(b *testing.B) { redisBenchmarkCeiling(b, srv) })
		}
		p := algorithm.MustCompile(sluice.Limit{Algorithm: a, Limit: redisLimit, Window: time.Second})
		// Each algorithm has keys of its own.
		s, err := sluiceredis.New(sluiceredis.Config{Addrs: []string{srv.Addr}, Prefix: a.String() + ":"})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		b.Run(a.String()+"/parallel-64", func(b *testing.B) {
			runParallel64(b, func(ctx context.Context, key string) error {
				var out [1]sluice.Decision
				return s.Check(ctx, []store.Request{{Key: key, Params: &p, Cost: 1}}, out[:])
			})
		})
	}
}

// redisBenchmarkCeiling runs redis-benchmark -P 16 with 64 connections,
// calling Sluice's script for one check (checkeach.lua: GCRA, one key of
// 10,000, the server's clock) with EVALSHA, and reports its requests per second as checks/s.
func redisBenchmarkCeiling(b *testing.B, srv *redistest.Server) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Skip("redis-benchmark not installed")
	}
	script, err := os.ReadFile("../store/redis/checkeach.lua")
	if err != nil {
		b.Fatal(err)
	}
	sha, err := srv.Do("SCRIPT", "LOAD", string(script))
	if err != nil {
		b.Fatal(err)
	}
	args := ceilingArgs(srv.Port, sha, max(b.N, 1000))
	b.ResetTimer()
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		b.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[1]) < 2 {
		b.Fatalf("redis-benchmark output: %q", out)
	}
	rps, err := strconv.ParseFloat(recs[1][1], 64)
	if err != nil {
		b.Fatalf("redis-benchmark output: %q", out)
	}
	b.ReportMetric(rps, "checks/s")
}

// ceilingArgs are the arguments of redis-benchmark for the ceiling: n
// EVALSHA calls of the script on random keys of 10,000, deciding GCRA at
// 10,000 per second, 16 commands per pipeline, 64 connections.
func ceilingArgs(port int, sha string, n int) []string {
	return []string{"-h", "127.0.0.1", "-p", strconv.Itoa(port), "-P", "16", "-c", "64", "-n", strconv.Itoa(n), "-r", strconv.Itoa(redisKeys), "--csv",
		"EVALSHA", sha, "1", "rl:bench:{user=__rand_int__}",
		// The expiry margin, one parameter set, Redis' clock, the set
		// (GCRA), then the check: set 1, cost 1.
		"1000", "1", "1",
		"6", strconv.Itoa(redisLimit), strconv.Itoa(redisLimit), "1000000", "1", "0", "0",
		"1", "1"}
}

// newGoRedis returns a go-redis client for the server, with its default
// pool.
func newGoRedis(b *testing.B, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	b.Cleanup(func() { c.Close() })
	return c
}

// benchReferenceRedis adds the Redis references to BenchmarkReference:
// go-redis/redis_rate's AllowN (GCRA) and, to compare the clients alone,
// Sluice's own script sent by go-redis instead of rueidis.
func benchReferenceRedis(b *testing.B) {
	b.Run("redis_rate/parallel-64", func(b *testing.B) {
		srv := redistest.Start(b)
		lim := redis_rate.NewLimiter(newGoRedis(b, srv.Addr))
		l := redis_rate.Limit{Rate: redisLimit, Burst: redisLimit, Period: time.Second}
		runParallel64(b, func(ctx context.Context, key string) error {
			_, err := lim.AllowN(ctx, key, l, 1)
			return err
		})
	})
	b.Run("sluice-script-on-go-redis/parallel-64", func(b *testing.B) {
		srv := redistest.Start(b)
		c := newGoRedis(b, srv.Addr)
		script, err := os.ReadFile("../store/redis/checkeach.lua")
		if err != nil {
			b.Fatal(err)
		}
		sc := goredis.NewScript(string(script))
		args := ceilingArgs(0, "", 0)[17:] // the script's arguments after the key
		argv := make([]any, len(args))
		for i, a := range args {
			argv[i] = a
		}
		runParallel64(b, func(ctx context.Context, key string) error {
			return sc.Run(ctx, c, []string{key}, argv...).Err()
		})
	})
}
