package globalsync

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// BenchmarkCheckGlobalRedis: checks on a real redis-server, from parallel
// callers over 1,000 clients, of a rule with a regional limit alone
// (regional-only), a rule with a global limit alone, shared through a Sync
// on NATS (global-only), the regional rule with a global limit too
// (with-global), and two regional limits (two-regional): the cost of a
// global limit on the check path, same run. Global-only against
// regional-only is a limit against a limit, each one key; with-global
// against two-regional is two limits against two.
// Beside the time per check it reports the CPU time per check of this
// process and of the redis-server (client-ns/op, redis-ns/op), which the
// machine's other loads move less than the checks per second.
func BenchmarkCheckGlobalRedis(b *testing.B) {
	srvRedis := redistest.Start(b)
	st, err := redis.New(redis.Config{Addrs: []string{srvRedis.Addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	s, err := Start(context.Background(), Config{Region: "eu", URL: srv.URL(), Stream: srv.Name("BENCH")})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for _, bc := range []struct {
		name, rule string
		view       engine.GlobalView
	}{
		{"regional-only", "{ id: api, match: { resource: /api }, dimension: client, limit: 1000000000, window: 1m }", nil},
		{"global-only", "{ id: api, match: { resource: /api }, dimension: client, window: 1m, global_limit: 1000000000 }", KeyView{s}},
		{"with-global", "{ id: api, match: { resource: /api }, dimension: client, limit: 1000000000, window: 1m, global_limit: 1000000000 }", KeyView{s}},
		{"two-regional", "{ id: api, match: { resource: /api }, dimension: client, limit: 1000000000, window: 1m }\n  - { id: api2, match: { resource: /api }, dimension: client, algorithm: fixed_window, limit: 1000000000, window: 1m }", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pol, err := policy.Parse("b.yaml", []byte("version: 1\nrules:\n  - "+bc.rule+"\n"))
			if err != nil {
				b.Fatal(err)
			}
			eng, err := engine.New(engine.Config{Store: st, Policy: pol, Global: bc.view})
			if err != nil {
				b.Fatal(err)
			}
			b.SetParallelism(16)
			cpu := startCPU(b, srvRedis)
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					c := engine.Check{ClientID: fmt.Sprintf("c%d", i%1000), Resource: "/api", Cost: 1}
					if _, err := eng.Check(context.Background(), &c); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
			cpu.report(b)
		})
	}
}

// cpuUse is the CPU time this process and a redis-server have used since
// a sub-benchmark started: per check, the cost of a check on a machine
// whose other loads move the checks per second from one run to the next.
type cpuUse struct {
	redis      *redistest.Server
	self, serv time.Duration
}

func startCPU(b *testing.B, r *redistest.Server) *cpuUse {
	c := &cpuUse{redis: r}
	c.self, c.serv = selfCPU(b), redisCPU(b, r)
	return c
}

// report reports the CPU time per check of this process (client-ns/op)
// and of Redis (redis-ns/op).
func (c *cpuUse) report(b *testing.B) {
	n := float64(b.N)
	b.ReportMetric(float64(selfCPU(b)-c.self)/n, "client-ns/op")
	b.ReportMetric(float64(redisCPU(b, c.redis)-c.serv)/n, "redis-ns/op")
}

func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns r's CPU time so far, user and system.
func redisCPU(b testing.TB, r *redistest.Server) time.Duration {
	info, err := r.Info("cpu")
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
