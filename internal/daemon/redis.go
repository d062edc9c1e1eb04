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

// RedisOptions are the connection settings of a Redis store (see
// redis.Config for each); zero fields take the store's defaults.
type RedisOptions struct {
	// DialTimeout bounds the opening of a connection.
	DialTimeout time.Duration
	// WriteTimeout is how long a connection may stay unable to write or
	// to answer before it is closed and its calls fail.
	WriteTimeout time.Duration
	// KeepAlive is the period of TCP keep-alive probes; negative turns
	// them off.
	KeepAlive time.Duration
	// ConnsPerNode is the number of connections to each node, over which
	// concurrent calls are pipelined.
	ConnsPerNode int
}

// openRedis opens a Redis or Redis Cluster store from its URL
// (redis://host:port[/db], rediss://..., redis-cluster://host:port,...)
// and registers its metrics on reg.
func openRedis(ctx context.Context, rawURL string, opts RedisOptions, log *slog.Logger, reg prometheus.Registerer) (engine.Store, func() error, error) {
	cfg, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: store URL %q: %w", redactURL(rawURL), err)
	}
	cfg.DialTimeout, cfg.WriteTimeout = opts.DialTimeout, opts.WriteTimeout
	cfg.KeepAlive, cfg.ConnsPerNode = opts.KeepAlive, opts.ConnsPerNode
	corrupt := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_redis_corrupt_state_resets_total",
		Help: "Keys whose state the Redis store found corrupt (wrong type, unknown format) and reset.",
	})
	tryAgain := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_redis_tryagain_retries_total",
		Help: "Script calls the Redis store sent again after a Redis Cluster refused them with TRYAGAIN (keys of a slot moving between masters).",
	})
	for _, c := range []prometheus.Collector{corrupt, tryAgain} {
		if err := reg.Register(c); err != nil {
			return nil, nil, fmt.Errorf("daemon: metrics: %w", err)
		}
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
	cfg.OnTryAgain = func(n int) { tryAgain.Add(float64(n)) }
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("daemon: store %q: %w", redactURL(rawURL), err)
	}
	s, err := redis.New(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: store %q: %w", redactURL(rawURL), err)
	}
	return s, s.Close, nil
}
