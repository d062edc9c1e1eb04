package bench

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

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
// Redis server's clock; and, for the record, the ceiling Redis
// reaches with the same script on the same server, 16 calls to a
// pipeline from 64 goroutines (ceiling-P16).
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

// redisBenchmarkCeiling calls Sluice's script for one check (checkeach.lua:
// GCRA, one key of 10,000 at random, the server's clock) with EVALSHA from
// 64 goroutines, each sending 16 calls at a time in one pipeline, and
// reports the calls per second as checks/s: the ceiling Redis itself sets
// on the machine for such calls. (The script's argument is binary, which
// redis-benchmark cannot send.)
func redisBenchmarkCeiling(b *testing.B, srv *redistest.Server) {
	script, err := os.ReadFile("../store/redis/checkeach.lua")
	if err != nil {
		b.Fatal(err)
	}
	sha, err := srv.Do("SCRIPT", "LOAD", string(script))
	if err != nil {
		b.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	arg := ceilingArg()
	ctx := context.Background()
	var next atomic.Int64
	batches := int64((max(b.N, 1000) + 15) / 16)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			cmds := make(rueidis.Commands, 16)
			for next.Add(1) <= batches {
				for i := range cmds {
					key := redisKeyNames[rng.IntN(redisKeys)]
					cmds[i] = c.B().Evalsha().Sha1(sha).Numkeys(1).Key(key).Arg(arg).Build()
				}
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(batches*16)/time.Since(start).Seconds(), "checks/s")
}

// ceilingArg is checkeach.lua's argument for one check of GCRA at
// redisLimit per second at the server's clock: the expiry margin (1000
// ms), one parameter set, every check on set 1, each on its own (not all
// or nothing), at cost 1, then the set (see the script's header).
func ceilingArg() string {
	b := binary.LittleEndian.AppendUint64(nil, math.Float64bits(1000))
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(1))
	for _, v := range []float64{6, redisLimit, redisLimit, 1_000_000, 1, 0, 0} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
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
		arg := ceilingArg()
		runParallel64(b, func(ctx context.Context, key string) error {
			return sc.Run(ctx, c, []string{key}, arg).Err()
		})
	})
}
