package main

import (
	"crypto/x509"
	"errors"
	"flag"
	"fmt"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/store/redis"
)

// redisFlags defines the connection flags of a Redis store and returns
// the function that builds its options once they are parsed.
func redisFlags(fs *flag.FlagSet) func() daemon.RedisOptions {
	dial := fs.Duration("redis-dial-timeout", redis.DefaultDialTimeout, "bound on opening a connection to Redis")
	write := fs.Duration("redis-write-timeout", redis.DefaultWriteTimeout, "how long a Redis connection may stay unable to write or answer before it is closed")
	keepAlive := fs.Duration("redis-keepalive", redis.DefaultKeepAlive, "period of TCP keep-alive probes on Redis connections; negative turns them off")
	conns := fs.Int("redis-conns-per-node", 0, "connections to each Redis node, over which concurrent calls are pipelined (1 to 256, rounded up to a power of two); 0 is the client's default")
	ca := fs.String(redisTLSFlags["TLSCAFile"], "", "PEM file of the CA certificates that a rediss:// store's server certificate must chain to, in place of the system's")
	cert := fs.String(redisTLSFlags["TLSCertFile"], "", "PEM file of the client certificate (and its intermediates) presented to a rediss:// store for mutual TLS; needs --redis-tls-key-file")
	key := fs.String(redisTLSFlags["TLSKeyFile"], "", "PEM file of the private key of --redis-tls-cert-file")
	serverName := fs.String(redisTLSFlags["TLSServerName"], "", "name a rediss:// store's server certificate must hold; empty: the host of each address dialed")
	return func() daemon.RedisOptions {
		return daemon.RedisOptions{DialTimeout: *dial, WriteTimeout: *write, KeepAlive: *keepAlive, ConnsPerNode: *conns,
			TLSCAFile: *ca, TLSCertFile: *cert, TLSKeyFile: *key, TLSServerName: *serverName}
	}
}

// redisTLSFlags names the flag of each TLS option of daemon.RedisOptions.
var redisTLSFlags = map[string]string{
	"TLSCAFile":     "redis-tls-ca-file",
	"TLSCertFile":   "redis-tls-cert-file",
	"TLSKeyFile":    "redis-tls-key-file",
	"TLSServerName": "redis-tls-server-name",
}

// flagError returns err, or, when err is about a Redis TLS option, the
// same error told in terms of its flag; to a server certificate of an
// unknown authority it adds the flag that names one.
func flagError(err error) error {
	if err, ok := tlsFlagError(err); ok {
		return err
	}
	var unknownCA x509.UnknownAuthorityError
	if errors.As(err, &unknownCA) {
		return fmt.Errorf("%w (a server certificate of a private CA needs that CA in --%s)", err, redisTLSFlags["TLSCAFile"])
	}
	var te *daemon.RedisTLSError
	if !errors.As(err, &te) {
		return err
	}
	name, ok := redisTLSFlags[te.Option]
	if !ok {
		return err
	}
	if te.File != "" {
		return fmt.Errorf("--%s %q: %w", name, te.File, te.Err)
	}
	return fmt.Errorf("--%s: %w", name, te.Err)
}

// guardFlags defines the flags of the guard around a Redis store and
// returns the function that builds its configuration once they are
// parsed.
func guardFlags(fs *flag.FlagSet) func() guard.Config {
	deadline := fs.Duration("store-deadline", guard.DefaultDeadline, "deadline of every Redis call of a check, Redis answering slowly included; a client's shorter deadline wins")
	stall := fs.Duration("store-stall-timeout", 0, "a Redis call gives up when Redis has answered no call at all for this long (paused, cut off); 0 learns it from Redis' latency (4x the slowest recent answer, at least "+guard.DefaultStallFloor.String()+"); negative: off")
	inflight := fs.Int("store-max-in-flight", guard.DefaultMaxInFlight, "Redis calls in flight at most, those whose checks already gave up at the deadline included")
	gatherers := fs.Int("store-gatherers", guard.DefaultGatherers, "Redis calls of gathered checks in flight at once: checks that arrive meanwhile wait and go in the next call together; negative: a call per check")
	breaker := fs.Bool("breaker", true, "circuit breaker around the Redis store")
	bWindow := fs.Duration("breaker-window", guard.DefaultBreakerWindow, "rolling window over which the breaker measures the failure ratio")
	bMin := fs.Uint("breaker-min-requests", guard.DefaultBreakerMinRequests, "calls the window must hold before the breaker may open")
	bRatio := fs.Float64("breaker-failure-ratio", guard.DefaultBreakerFailureRatio, "failure ratio in the window at or above which the breaker opens")
	bOpen := fs.Duration("breaker-open-timeout", guard.DefaultBreakerOpenTimeout, "how long the breaker stays open before it lets probes through")
	bProbes := fs.Uint("breaker-probes", guard.DefaultBreakerProbes, "probe calls let through half-open, and consecutive successes that close the breaker")
	bSustain := fs.Duration("breaker-sustain", guard.DefaultBreakerSustain, "how long the failure ratio must hold before the breaker opens (a stall of the server itself must not open it); negative: at once")
	olc := fs.Bool("over-limit-cache", true, "answer keys denied until a known instant in process until then")
	olcKeys := fs.Int("over-limit-cache-keys", guard.DefaultOverLimitMaxKeys, "keys the over-limit cache remembers at most")
	hot := fs.Bool("hot-keys", false, "decide hot keys in process from leases synced with Redis")
	hotRate := fs.Float64("hot-key-threshold", guard.DefaultHotThreshold, "checks per second of one key from which it is hot")
	hotSync := fs.Duration("hot-key-sync-interval", guard.DefaultHotSyncInterval, "how often hot keys' leases are synced with Redis (10ms to 100ms is sensible)")
	hotWindow := fs.Duration("hot-key-window", guard.DefaultHotWindow, "hot-key detection window")
	hotMax := fs.Int("hot-key-max", guard.DefaultHotMaxKeys, "hot keys at most")
	return func() guard.Config {
		return guard.Config{
			Deadline:     *deadline,
			StallTimeout: *stall,
			MaxInFlight:  *inflight,
			Gatherers:    *gatherers,
			Breaker: guard.BreakerConfig{Disabled: !*breaker, Window: *bWindow, MinRequests: uint32(min(*bMin, 1<<31)),
				FailureRatio: *bRatio, OpenTimeout: *bOpen, Probes: uint32(min(*bProbes, 1<<31)), Sustain: *bSustain},
			OverLimit: guard.OverLimitConfig{Disabled: !*olc, MaxKeys: *olcKeys},
			HotKeys: guard.HotKeyConfig{Enabled: *hot, Threshold: *hotRate, SyncInterval: *hotSync,
				Window: *hotWindow, MaxKeys: *hotMax},
		}
	}
}
