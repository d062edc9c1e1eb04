package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/store/redis"
)

// The Redis store keeps idempotency records for every instance sharing it.
var _ engine.IdempotentStore = (*redis.Store)(nil)

// openRedis opens a Redis or Redis Cluster store from its URL
// (redis://host:port[/db], rediss://..., redis-cluster://host:port,...)
// and registers its metrics on reg.
func openRedis(ctx context.Context, rawURL string, log *slog.Logger, reg prometheus.Registerer) (engine.Store, func() error, error) {
	cfg, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: store URL %q: %w", redactURL(rawURL), err)
	}
	corrupt := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_redis_corrupt_state_resets_total",
		Help: "Keys whose state the Redis store found corrupt (wrong type, unknown format) and reset.",
	})
	if err := reg.Register(corrupt); err != nil {
		return nil, nil, fmt.Errorf("daemon: metrics: %w", err)
	}
	cfg.Logger = log
	if cfg.MaxFlushDelay == 0 {
		// Gathering the commands of concurrent checks for up to 50 µs per
		// write cost the server 10 to 30% less CPU per check in paired
		// Envoy load runs (docs/PERFORMANCE.md), for at most 50 µs of
		// latency.
		cfg.MaxFlushDelay = 50 * time.Microsecond
	}
	cfg.OnCorrupt = func(n int) { corrupt.Add(float64(n)) }
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("daemon: store %q: %w", redactURL(rawURL), err)
	}
	s, err := redis.New(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: store %q: %w", redactURL(rawURL), err)
	}
	return s, s.Close, nil
}
