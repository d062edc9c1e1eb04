package globalsync

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// BenchmarkCheckGlobalRedis: checks on a real redis-server, of a rule with
// its regional limit only (regional) and of the same rule with a global
// limit shared through a Sync on NATS (global), from parallel callers over
// 1,000 clients: the cost of a global limit on the check path, same run.
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
		{"regional", "{ id: api, match: { resource: /api }, dimension: client, limit: 1000000000, window: 1m }", nil},
		{"global", "{ id: api, match: { resource: /api }, dimension: client, limit: 1000000000, window: 1m, global_limit: 1000000000 }", KeyView{s}},
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
		})
	}
}
