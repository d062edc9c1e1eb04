package redispool

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// benchPolicy gives the pools of the benchmark 100,000 tokens: a token
// drawn stays held until its reservation expires (2 s), so that is what
// the pools hold at most at tens of thousands of operations per second.
const benchPolicy = `version: 1
rules:
  - {id: api, match: {resource: "/api/*"}, limit: 100000, window: 1m, algorithm: fixed_window}
`

// BenchmarkThroughput measures, on the package's standalone Redis and in
// one run, reservation operations per second through a Keeper (reserve,
// use, release in turn, each an operation; 8 pools of 100,000 tokens shared
// by the callers, no request queued; the Redis server's clock) beside checks
// per second of the rate-limit store on the same Redis (one fixed-window
// check per call, 10,000 keys): the reference.
//
//	go test -run '^$' -bench Throughput -benchtime 5s -count 3 ./internal/reserve/redispool/
func BenchmarkThroughput(b *testing.B) {
	c := newClient(b, []string{standalone.Addr})
	b.Run("reservations", func(b *testing.B) {
		pol, err := policy.Parse("bench.yaml", []byte(benchPolicy))
		if err != nil {
			b.Fatal(err)
		}
		k, err := reserve.New(reserve.Config{Policy: func() *policy.Policy { return pol }, Backend: newPools(b, c)})
		if err != nil {
			b.Fatal(err)
		}
		defer k.Close()
		var callers atomic.Int64
		b.SetParallelism(16)
		cpu0, redis0 := cpuTime(b), redisCPU(b)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := callers.Add(1)
			client, resource := "c"+strconv.FormatInt(i, 10), fmt.Sprintf("/api/r%d", i%8)
			var id string
			for step := 0; pb.Next(); step++ {
				var err error
				switch step % 3 {
				case 0:
					var res reserve.Result
					res, err = k.Reserve(reserve.Ask{Client: client, Resource: resource, Tokens: 2,
						Duration: 2 * time.Second, Priority: 2})
					id = res.ID
				case 1:
					_, err = k.Use(&policy.Request{ClientID: client, Resource: resource}, id, 1)
				case 2:
					_, err = k.Release(client, id)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		report(b, cpu0, redis0)
	})
	b.Run("checks", func(b *testing.B) {
		s, err := redis.New(redis.Config{Client: c, Prefix: "bench:"})
		if err != nil {
			b.Fatal(err)
		}
		p := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1 << 40, Window: time.Minute})
		var callers atomic.Int64
		b.SetParallelism(16)
		cpu0, redis0 := cpuTime(b), redisCPU(b)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := callers.Add(1)
			reqs := []store.Request{{Params: &p, Cost: 1}}
			out := make([]sluice.Decision, 1)
			for n := i; pb.Next(); n += 7 {
				reqs[0].Key = "k{" + strconv.FormatInt(n%10_000, 10) + "}"
				if err := s.Check(context.Background(), reqs, out); err != nil {
					b.Error(err)
					return
				}
			}
		})
		report(b, cpu0, redis0)
	})
}

// report reports the operations per second, and the CPU time per
// operation of this process (callers and client) and of redis-server,
// which a shared machine moves less than it moves the rate.
func report(b *testing.B, cpu0, redis0 time.Duration) {
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "µs-cpu/op")
	b.ReportMetric(float64((redisCPU(b)-redis0).Microseconds())/float64(b.N), "µs-redis/op")
}

// cpuTime returns the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns the CPU time the standalone server has used.
func redisCPU(b *testing.B) time.Duration {
	info, err := standalone.Info("cpu")
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
		sec, err := strconv.ParseFloat(info[k], 64)
		if err != nil {
			b.Fatal(err)
		}
		total += time.Duration(sec * float64(time.Second))
	}
	return total
}
