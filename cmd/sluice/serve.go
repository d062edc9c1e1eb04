package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/logging"
	"github.com/sluicehq/sluice/internal/share"
	"github.com/sluicehq/sluice/store/redis"
)

// defaults are the flags' defaults taken from the packages that define
// them, for the default tags: default:"${store}".
func defaults() kong.Vars {
	d := func(v time.Duration) string { return v.String() }
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return kong.Vars{
		"store":                   daemon.DefaultStoreURL,
		"http_addr":               daemon.DefaultHTTPAddr,
		"grpc_addr":               daemon.DefaultGRPCAddr,
		"grpc_keepalive":          d(daemon.DefaultGRPCKeepalive),
		"grpc_max_connection_age": d(daemon.DefaultGRPCMaxConnectionAge),
		"grpc_max_conns":          n(daemon.DefaultGRPCMaxConns),
		"bulk_share":              f(share.DefaultShare),
		"bulk_checks":             n(share.DefaultBulkChecks),
		"analytics_retention":     d(daemon.DefaultAnalyticsRetention),
		"redis_dial_timeout":      d(redis.DefaultDialTimeout),
		"redis_write_timeout":     d(redis.DefaultWriteTimeout),
		"redis_keepalive":         d(redis.DefaultKeepAlive),
		"store_deadline":          d(guard.DefaultDeadline),
		"stall_floor":             d(guard.DefaultStallFloor),
		"store_max_in_flight":     n(guard.DefaultMaxInFlight),
		"store_gatherers":         n(guard.DefaultGatherers),
		"store_gather_fill":       n(guard.DefaultGatherFill),
		"breaker_window":          d(guard.DefaultBreakerWindow),
		"breaker_min_requests":    n(guard.DefaultBreakerMinRequests),
		"breaker_failure_ratio":   f(guard.DefaultBreakerFailureRatio),
		"breaker_open_timeout":    d(guard.DefaultBreakerOpenTimeout),
		"breaker_probes":          n(guard.DefaultBreakerProbes),
		"breaker_sustain":         d(guard.DefaultBreakerSustain),
		"over_limit_cache_keys":   n(guard.DefaultOverLimitMaxKeys),
		"hot_key_threshold":       f(guard.DefaultHotThreshold),
		"hot_key_sync_interval":   d(guard.DefaultHotSyncInterval),
		"hot_key_window":          d(guard.DefaultHotWindow),
		"hot_key_max":             n(guard.DefaultHotMaxKeys),
	}
}

// serveCmd is `sluice serve`: its flags fill a daemon.Config.
type serveCmd struct {
	Config            string        `name:"config" placeholder:"PATH" env:"SLUICE_CONFIG" help:"policy file, Sluice's YAML or envoyproxy/ratelimit's, or a directory of envoyproxy/ratelimit files (*.yaml, *.yml), one domain each; empty serves the built-in example policy"`
	MergeDomainConfig bool          `name:"merge-domain-config" env:"SLUICE_MERGE_DOMAIN_CONFIG" help:"let several files of a --config directory hold one Envoy domain and merge their descriptors, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG; without it such a configuration is rejected"`
	Store             string        `name:"store" default:"${store}" env:"SLUICE_STORE" help:"store: memory://, redis://host:port[/db], redis-cluster://host:port,host:port,... (rediss:// and rediss-cluster:// for TLS) or redis-sentinel://host:26379,.../master[/db]"`
	HTTPAddr          string        `name:"http-addr" default:"${http_addr}" env:"SLUICE_HTTP_ADDR" help:"listen address of the HTTP JSON API"`
	GRPCAddr          string        `name:"grpc-addr" default:"${grpc_addr}" env:"SLUICE_GRPC_ADDR" help:"listen address of the gRPC and Envoy APIs"`
	GRPCReadTimeout   time.Duration `name:"grpc-read-timeout" default:"0s" env:"SLUICE_GRPC_READ_TIMEOUT" help:"how long a unary gRPC call may take to send its request (message and half-close) after its headers; it then ends with DeadlineExceeded; 0 or negative: no bound (costs each call about 5% more CPU; for clients you do not trust)"`
	GRPCKeepalive     time.Duration `name:"grpc-keepalive" default:"${grpc_keepalive}" env:"SLUICE_GRPC_KEEPALIVE" help:"how long a gRPC connection may receive nothing before the server pings the client, closing the connection when the ping is not answered within 20s (or this, when shorter); negative: no pings"`
	GRPCMaxAge        time.Duration `name:"grpc-max-connection-age" default:"${grpc_max_connection_age}" env:"SLUICE_GRPC_MAX_CONNECTION_AGE" help:"how long a gRPC connection may live (spread by +/-10%): then the server asks the client to reconnect, lets its calls finish (10s at most) and closes it, so that Envoys spread their checks over instances added by a scale-up; negative: no maximum"`
	GRPCMaxConns      int           `name:"grpc-max-conns" default:"${grpc_max_conns}" env:"SLUICE_GRPC_MAX_CONNS" help:"gRPC connections open at once at most; at the bound the one idle the longest (no call for 1s) is closed, and when none is idle new ones wait; negative: no bound"`
	GRPCReflection    bool          `name:"grpc-reflection" env:"SLUICE_GRPC_REFLECTION" help:"serve gRPC server reflection on the gRPC address, for tools such as grpcurl (it lists every service and message to whoever reaches the address)"`
	EnvoyCompat       bool          `name:"envoy-compat" env:"SLUICE_ENVOY_COMPAT" help:"answer Envoy's rate limit API as envoyproxy/ratelimit does where Sluice differs: descriptors decided each on its own, refused hits counted (fixed windows), limit_remaining 0 when over the limit, a descriptor with no entries not limited (docs/api.md); set it alike on every instance sharing a store"`
	BulkShare         float64       `name:"bulk-share" default:"${bulk_share}" env:"SLUICE_BULK_SHARE" help:"share of the time and of the CPUs that requests of more than --bulk-checks checks (batches, Envoy calls) may take while smaller ones are in progress (or were in the last 10ms): they then wait between slices of their work, never past half of their deadline, so that one client's large batches do not slow the others' checks; 1: no bound"`
	BulkChecks        int           `name:"bulk-checks" default:"${bulk_checks}" env:"SLUICE_BULK_CHECKS" help:"most checks (or Envoy descriptors) of a request that --bulk-share leaves alone"`
	NoReservations    bool          `name:"no-reservations" env:"SLUICE_NO_RESERVATIONS" help:"do not serve reservations of capacity (/api/v1/reserve and the reservation_id of checks; on a Redis store their pools live in Redis, shared by every instance)"`
	EnvoyPreciseReset bool          `name:"envoy-precise-reset" env:"SLUICE_ENVOY_PRECISE_RESET" help:"report Envoy's duration_until_reset to the microsecond instead of in whole seconds (envoyproxy/ratelimit's)"`
	LogFormat         string        `name:"log-format" default:"text" env:"SLUICE_LOG_FORMAT" help:"log format: text or json"`
	LogLevel          string        `name:"log-level" default:"info" env:"SLUICE_LOG_LEVEL" help:"log level: debug, info, warn or error"`
	DebugAddr         string        `name:"debug-addr" placeholder:"HOST:PORT" env:"SLUICE_DEBUG_ADDR" help:"listen address of the debug listener (pprof, /metrics); empty: none; loopback only unless --debug-allow-remote"`
	DebugAllowRemote  bool          `name:"debug-allow-remote" env:"SLUICE_DEBUG_ALLOW_REMOTE" help:"let --debug-addr listen on a non-loopback address"`
	GCPercent         int           `name:"gc-percent" default:"400" env:"SLUICE_GC_PERCENT" help:"Go garbage collector target percentage when GOGC is not set (0 or less: Go's default, 100): higher trades memory for less CPU per check (see docs/operations.md)"`
	ExitOnUnavailable bool          `name:"exit-on-unavailable-store" env:"SLUICE_EXIT_ON_UNAVAILABLE_STORE" help:"exit at start when the Redis store does not answer; by default the server starts, decides checks by the rules' failure modes, reports not ready on /readyz and gRPC health, and connects when Redis comes up"`
	ShutdownDelay     time.Duration `name:"shutdown-delay" default:"0s" env:"SLUICE_SHUTDOWN_DELAY" help:"on SIGINT or SIGTERM, how long to keep serving while not ready (/readyz 503, gRPC health NOT_SERVING) before closing the listeners, for load balancers to stop sending checks first (a few seconds under Kubernetes); 0: none"`
	ShutdownTimeout   time.Duration `name:"shutdown-timeout" default:"15s" env:"SLUICE_SHUTDOWN_TIMEOUT" help:"how long a graceful shutdown waits for checks in flight"`
	OTLPEndpoint      string        `name:"otlp-endpoint" placeholder:"HOST:PORT" env:"SLUICE_OTLP_ENDPOINT" help:"host:port of an OpenTelemetry collector receiving the checks' spans over OTLP/gRPC (plain TCP), such as localhost:4317; empty: no tracing"`
	TraceSampleRatio  float64       `name:"trace-sample-ratio" default:"0.01" env:"SLUICE_TRACE_SAMPLE_RATIO" help:"share of checks traced, 0 to 1, among those whose caller sent no W3C traceparent; a caller's trace is followed, sampled or not (with --otlp-endpoint)"`

	Guard     guardFlags     `embed:"" group:"Redis store: deadlines, breaker, caches"`
	Redis     redisFlags     `embed:"" group:"Redis connections"`
	Control   controlFlags   `embed:"" group:"Control plane, admin API, regions"`
	Analytics analyticsFlags `embed:"" group:"Analytics"`
	TLS       serveTLSFlags  `embed:"" group:"TLS"`
}

func (serveCmd) Help() string {
	return "Every flag has an environment variable, shown as ($SLUICE_...), read when the flag is not given: the flag wins."
}

// check returns the error of a flag whose value serve cannot take.
func (c *serveCmd) check() error {
	switch {
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("--shutdown-timeout %s: want 0 or more", c.ShutdownTimeout)
	case !(c.TraceSampleRatio >= 0 && c.TraceSampleRatio <= 1):
		return fmt.Errorf("--trace-sample-ratio %v: want 0 to 1", c.TraceSampleRatio)
	case c.ShutdownDelay < 0:
		return fmt.Errorf("--shutdown-delay %s: want 0 or more", c.ShutdownDelay)
	}
	return nil
}

// config returns the daemon's configuration of the flags.
func (c *serveCmd) config() daemon.Config {
	cfg := daemon.Config{
		HTTPAddr:     c.HTTPAddr,
		GRPCAddr:     c.GRPCAddr,
		ConfigPath:   c.Config,
		MergeDomains: c.MergeDomainConfig,
		StoreURL:     c.Store,
		Guard:        c.Guard.config(),
		Redis:        c.Redis.options(),

		GRPCReadTimeout:      c.GRPCReadTimeout,
		GRPCMaxConns:         c.GRPCMaxConns,
		GRPCKeepalive:        c.GRPCKeepalive,
		GRPCMaxConnectionAge: c.GRPCMaxAge,
		GRPCReflection:       c.GRPCReflection,

		EnvoyCompat:       c.EnvoyCompat,
		EnvoyPreciseReset: c.EnvoyPreciseReset,
		NoReservations:    c.NoReservations,
		BulkShare:         c.BulkShare,
		BulkChecks:        c.BulkChecks,

		ExitOnUnavailableStore: c.ExitOnUnavailable,
		ShutdownDelay:          c.ShutdownDelay,

		DebugAddr:        c.DebugAddr,
		DebugAllowRemote: c.DebugAllowRemote,

		OTLPEndpoint:     c.OTLPEndpoint,
		TraceSampleRatio: c.TraceSampleRatio,
	}
	c.Analytics.fill(&cfg)
	c.TLS.fill(&cfg)
	return cfg
}

func (c *serveCmd) run(inv *invocation) int {
	if err := c.check(); err != nil {
		fmt.Fprintf(inv.stderr, "sluice serve: %v\n", err)
		return 2
	}
	logger, err := logging.New(inv.stderr, c.LogFormat, c.LogLevel)
	if err != nil {
		fmt.Fprintf(inv.stderr, "sluice serve: --log-format/--log-level: %v\n", err)
		return 2
	}
	if inv.getenv("GOGC") == "" && c.GCPercent > 0 {
		debug.SetGCPercent(c.GCPercent)
	}

	// Signals are subscribed before the listeners open, so that none is
	// missed once the daemon serves.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	cfg := c.config()
	cfg.Logger = logger
	if err := c.Control.fill(&cfg, inv.stderr); err != nil {
		fmt.Fprintf(inv.stderr, "sluice serve: %v\n", err)
		return 1
	}
	startCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	d, err := daemon.Start(startCtx, cfg)
	cancel()
	if err != nil {
		logger.Error("cannot start", "err", flagError(err))
		return 1
	}
	for sig := range sigs {
		if sig == syscall.SIGHUP {
			logger.Info("SIGHUP: reloading the configuration")
			d.Reload() // logs its own errors
			continue
		}
		logger.Info("shutting down", "signal", sig.String())
		ctx, cancel := context.WithTimeout(context.Background(), c.ShutdownDelay+c.ShutdownTimeout)
		err := d.Shutdown(ctx)
		cancel()
		if err != nil {
			logger.Error("shutdown", "err", err)
			return 1
		}
		return 0
	}
	return 0
}
