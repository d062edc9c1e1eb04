package daemon

import (
	"context"
	"fmt"
	"log/slog"

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
