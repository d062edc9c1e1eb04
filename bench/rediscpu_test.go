package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
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

// The Redis CPU benchmark: the Redis server's own CPU time (INFO cpu,
// used_cpu_user + used_cpu_sys, its network work included) divided by the
// checks made, which sets how many Redis shards a deployment needs. The
// checks are spread over redisKeys keys at a limit that admits nearly all
// of them, so that nearly every check writes.
const (
	// cpuCallers is the number of goroutines sending calls at once.
	cpuCallers = 64
	// cpuGathered is the checks per store call of the gathered runs:
	// about what the service gathers into one call under load from 64
	// callers.
	cpuGathered = 10
	// cpuLimit is the limit per minute of every key: the window of the
	// service's load runs (examples/load.yaml), high enough to admit every
	// check.
	cpuLimit = 1_000_000
)

// BenchmarkRedisCPU reports the Redis CPU per check (redis-cpu-µs/check)
// of Sluice's store for every algorithm, its checks gathered cpuGathered
// to a call as the service gathers concurrent checks, and one check per
// call; and, on the same server in the same run, that of go-redis/redis_rate's
// GCRA script and of a script of one INCR, each one call per check,
// pipelined by the client. Run it with a fixed number of checks:
//
//	cd bench && go test -run '^$' -bench RedisCPU -benchtime 60000x
func BenchmarkRedisCPU(b *testing.B) {
	srv := redistest.Start(b)
	for _, a := range sluice.Algorithms {
		limit := int64(cpuLimit)
		if a == sluice.SlidingWindowLog {
			limit = sluiceredis.DefaultMaxLogEntries // its largest
		}
		p := algorithm.MustCompile(sluice.Limit{Algorithm: a, Limit: limit, Window: time.Minute})
		s, err := sluiceredis.New(sluiceredis.Config{Addrs: []string{srv.Addr}, Prefix: a.String() + ":"})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		for _, n := range []int{cpuGathered, 1} {
			b.Run(a.String()+"/gathered-"+strconv.Itoa(n), func(b *testing.B) {
				redisCPU(b, srv, n, func(ctx context.Context, keys []string) error {
					reqs := make([]store.Request, len(keys))
					for i, k := range keys {
						reqs[i] = store.Request{Key: k, Params: &p, Cost: 1}
					}
					out := make([]sluice.Decision, len(reqs))
					return s.Check(ctx, reqs, out)
				})
			})
		}
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	sha, args := redisRateScript(b, srv.Addr)
	b.Run("redis_rate-gcra-script", func(b *testing.B) {
		redisCPU(b, srv, 1, func(ctx context.Context, keys []string) error {
			return c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(1).Key("rate:"+keys[0]).Arg(args...).Build()).Error()
		})
	})
	incr, err := srv.Do("SCRIPT", "LOAD", "return redis.call('INCR', KEYS[1])")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("incr-script", func(b *testing.B) {
		redisCPU(b, srv, 1, func(ctx context.Context, keys []string) error {
			return c.Do(ctx, c.B().Evalsha().Sha1(incr).Numkeys(1).Key("incr:"+keys[0]).Build()).Error()
		})
	})
}

// redisRateScript returns the SHA-1 of the script go-redis/redis_rate
// runs for AllowN, and the arguments it passes for one request against
// redisLimit per second: it makes one such call, which loads the script
// into the server, and reads them from the command the library sent, so
// that the benchmark calls the library's own script.
func redisRateScript(b *testing.B, addr string) (sha string, args []string) {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	var sent []any
	c.AddHook(captureHook{func(cmd goredis.Cmder) {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			sent = cmd.Args()
		}
	}})
	lim := redis_rate.NewLimiter(c)
	if _, err := lim.AllowN(context.Background(), "probe", redis_rate.Limit{Rate: redisLimit, Burst: redisLimit, Period: time.Second}, 1); err != nil {
		b.Fatal(err)
	}
	// evalsha <sha> <numkeys> <key> <args...>, or eval <script> ...
	if len(sent) < 4 {
		b.Fatalf("redis_rate sent %v", sent)
	}
	if sent[0] == "eval" {
		out, err := c.ScriptLoad(context.Background(), sent[1].(string)).Result()
		if err != nil {
			b.Fatal(err)
		}
		sent[1] = out
	}
	for _, a := range sent[4:] {
		args = append(args, fmt.Sprint(a))
	}
	return fmt.Sprint(sent[1]), args
}

// captureHook passes every command go-redis sends to see.
type captureHook struct{ see func(goredis.Cmder) }

func (h captureHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h captureHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.see(cmd)
		return next(ctx, cmd)
	}
}
func (h captureHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// redisCPU makes b.N checks, n per call of call, from cpuCallers
// goroutines, each call on n distinct keys drawn at random from
// redisKeyNames, and reports the Redis server's CPU per check, the Redis
// commands per check (the script calls and the commands the scripts make,
// from INFO commandstats) and the checks per second.
func redisCPU(b *testing.B, srv *redistest.Server, n int, call func(ctx context.Context, keys []string) error) {
	ctx := context.Background()
	calls := (b.N + n - 1) / n
	var next atomic.Int64
	cpu0, cmds0 := redisCPUTime(b, srv), redisCommands(b, srv)
	start := time.Now()
	var wg sync.WaitGroup
	for g := range cpuCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			keys := make([]string, n)
			for next.Add(1) <= int64(calls) {
				base := rng.IntN(redisKeys)
				for i := range keys {
					keys[i] = redisKeyNames[(base+i*(redisKeys/n))%redisKeys]
				}
				if err := call(ctx, keys); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := redisCPUTime(b, srv) - cpu0
	cmds := redisCommands(b, srv) - cmds0
	checks := float64(calls * n)
	b.ReportMetric(cpu.Seconds()*1e6/checks, "redis-cpu-µs/check")
	b.ReportMetric(float64(cmds)/checks, "redis-cmds/check")
	b.ReportMetric(checks/elapsed.Seconds(), "checks/s")
	b.ReportMetric(0, "ns/op")
}

// redisCPUTime returns the CPU time the Redis server has used since it
// started (INFO cpu: used_cpu_user + used_cpu_sys).
func redisCPUTime(b *testing.B, srv *redistest.Server) time.Duration {
	info, err := srv.Info("cpu")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info[f], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %q", f, info[f])
		}
		total += v
	}
	return time.Duration(total * float64(time.Second))
}

// redisCommands returns the commands the Redis server has run (INFO
// commandstats: the calls of every command, those made by scripts
// included, but INFO's and CONFIG's).
func redisCommands(b *testing.B, srv *redistest.Server) int64 {
	info, err := srv.Info("commandstats")
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for name, v := range info {
		if !strings.HasPrefix(name, "cmdstat_") || strings.HasPrefix(name, "cmdstat_info") || strings.HasPrefix(name, "cmdstat_config") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			b.Fatalf("INFO commandstats %s: %q", name, v)
		}
		total += n
	}
	return total
}
