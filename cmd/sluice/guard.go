package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
)

// redisFlags are serve's flags of the connections to a Redis store.
type redisFlags struct {
	DialTimeout   time.Duration `name:"redis-dial-timeout" default:"${redis_dial_timeout}" env:"SLUICE_REDIS_DIAL_TIMEOUT" help:"bound on opening a connection to Redis"`
	WriteTimeout  time.Duration `name:"redis-write-timeout" default:"${redis_write_timeout}" env:"SLUICE_REDIS_WRITE_TIMEOUT" help:"how long a Redis connection may leave a ping unanswered before it is closed and its calls fail"`
	KeepAlive     time.Duration `name:"redis-keepalive" default:"${redis_keepalive}" env:"SLUICE_REDIS_KEEPALIVE" help:"period of TCP keep-alive probes on Redis connections, and how long one may answer nothing before it is pinged; negative turns both off"`
	ConnsPerNode  int           `name:"redis-conns-per-node" default:"0" env:"SLUICE_REDIS_CONNS_PER_NODE" help:"connections to each Redis node, over which concurrent calls are pipelined (1 to 256, rounded up to a power of two); 0 is the client's default"`
	TLSCAFile     string        `name:"redis-tls-ca-file" placeholder:"FILE" env:"SLUICE_REDIS_TLS_CA_FILE" help:"PEM file of the CA certificates that a rediss:// store's server certificate must chain to, in place of the system's"`
	TLSCertFile   string        `name:"redis-tls-cert-file" placeholder:"FILE" env:"SLUICE_REDIS_TLS_CERT_FILE" help:"PEM file of the client certificate (and its intermediates) presented to a rediss:// store for mutual TLS; needs --redis-tls-key-file"`
	TLSKeyFile    string        `name:"redis-tls-key-file" placeholder:"FILE" env:"SLUICE_REDIS_TLS_KEY_FILE" help:"PEM file of the private key of --redis-tls-cert-file"`
	TLSServerName string        `name:"redis-tls-server-name" env:"SLUICE_REDIS_TLS_SERVER_NAME" help:"name a rediss:// store's server certificate must hold; empty: the host of each address dialed"`
}

// options returns the Redis options of the flags.
func (f *redisFlags) options() daemon.RedisOptions {
	return daemon.RedisOptions{DialTimeout: f.DialTimeout, WriteTimeout: f.WriteTimeout, KeepAlive: f.KeepAlive, ConnsPerNode: f.ConnsPerNode,
		TLSCAFile: f.TLSCAFile, TLSCertFile: f.TLSCertFile, TLSKeyFile: f.TLSKeyFile, TLSServerName: f.TLSServerName}
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

// guardFlags are serve's flags of the guard around a Redis store.
type guardFlags struct {
	Deadline     time.Duration `name:"store-deadline" default:"${store_deadline}" env:"SLUICE_STORE_DEADLINE" help:"deadline of every Redis call of a check, Redis answering slowly included; a client's shorter deadline wins"`
	StallTimeout time.Duration `name:"store-stall-timeout" default:"0s" env:"SLUICE_STORE_STALL_TIMEOUT" help:"a Redis call gives up when Redis has answered no call at all for this long (paused, cut off); 0 learns it from Redis' latency (4x the slowest recent answer, at least ${stall_floor}); negative: off"`
	MaxInFlight  int           `name:"store-max-in-flight" default:"${store_max_in_flight}" env:"SLUICE_STORE_MAX_IN_FLIGHT" help:"Redis calls in flight at most, those whose checks already gave up at the deadline included"`
	Gatherers    int           `name:"store-gatherers" default:"${store_gatherers}" env:"SLUICE_STORE_GATHERERS" help:"Redis calls of gathered checks in flight at once: checks that arrive meanwhile wait and go in the next call together; negative: a call per check"`
	GatherFill   int           `name:"store-gather-fill" default:"${store_gather_fill}" env:"SLUICE_STORE_GATHER_FILL" help:"checks that must be queued for a gathered Redis call to start while another is in flight (at most 256); fewer wait for it and go in the next, which costs Redis less CPU per check; 1: a call for any check while fewer than --store-gatherers are in flight"`
	GatherWait   time.Duration `name:"store-gather-wait" default:"0s" env:"SLUICE_STORE_GATHER_WAIT" help:"how long a check that arrives while a gathered Redis call is in flight may wait, after it, for others to go in the next call, or until --store-gather-fill are queued (at most 10ms and half of --store-deadline): fewer, fuller calls cost Redis less CPU per check, at up to as much latency; a check that finds Redis idle goes at once; 0: none"`

	Breaker             bool          `name:"breaker" default:"true" env:"SLUICE_BREAKER" help:"circuit breaker around the Redis store"`
	BreakerWindow       time.Duration `name:"breaker-window" default:"${breaker_window}" env:"SLUICE_BREAKER_WINDOW" help:"rolling window over which the breaker measures the failure ratio"`
	BreakerMinRequests  uint          `name:"breaker-min-requests" default:"${breaker_min_requests}" env:"SLUICE_BREAKER_MIN_REQUESTS" help:"calls the window must hold before the breaker may open"`
	BreakerFailureRatio float64       `name:"breaker-failure-ratio" default:"${breaker_failure_ratio}" env:"SLUICE_BREAKER_FAILURE_RATIO" help:"failure ratio in the window at or above which the breaker opens"`
	BreakerOpenTimeout  time.Duration `name:"breaker-open-timeout" default:"${breaker_open_timeout}" env:"SLUICE_BREAKER_OPEN_TIMEOUT" help:"how long the breaker stays open before it lets probes through"`
	BreakerProbes       uint          `name:"breaker-probes" default:"${breaker_probes}" env:"SLUICE_BREAKER_PROBES" help:"probe calls let through half-open, and consecutive successes that close the breaker"`
	BreakerSustain      time.Duration `name:"breaker-sustain" default:"${breaker_sustain}" env:"SLUICE_BREAKER_SUSTAIN" help:"how long the failure ratio must hold before the breaker opens (a stall of the server itself must not open it); negative: at once"`

	OverLimitCache     bool `name:"over-limit-cache" default:"true" env:"SLUICE_OVER_LIMIT_CACHE" help:"answer keys denied until a known instant in process until then"`
	OverLimitCacheKeys int  `name:"over-limit-cache-keys" default:"${over_limit_cache_keys}" env:"SLUICE_OVER_LIMIT_CACHE_KEYS" help:"keys the over-limit cache remembers at most"`

	HotKeys            bool          `name:"hot-keys" env:"SLUICE_HOT_KEYS" help:"decide hot keys in process from leases synced with Redis"`
	HotKeyThreshold    float64       `name:"hot-key-threshold" default:"${hot_key_threshold}" env:"SLUICE_HOT_KEY_THRESHOLD" help:"checks per second of one key from which it is hot"`
	HotKeySyncInterval time.Duration `name:"hot-key-sync-interval" default:"${hot_key_sync_interval}" env:"SLUICE_HOT_KEY_SYNC_INTERVAL" help:"how often hot keys' leases are synced with Redis (10ms to 100ms is sensible)"`
	HotKeyWindow       time.Duration `name:"hot-key-window" default:"${hot_key_window}" env:"SLUICE_HOT_KEY_WINDOW" help:"hot-key detection window"`
	HotKeyMax          int           `name:"hot-key-max" default:"${hot_key_max}" env:"SLUICE_HOT_KEY_MAX" help:"hot keys at most"`
}

// config returns the guard's configuration of the flags.
func (f *guardFlags) config() guard.Config {
	return guard.Config{
		Deadline:     f.Deadline,
		StallTimeout: f.StallTimeout,
		MaxInFlight:  f.MaxInFlight,
		Gatherers:    f.Gatherers,
		GatherFill:   f.GatherFill,
		GatherWait:   f.GatherWait,
		Breaker: guard.BreakerConfig{Disabled: !f.Breaker, Window: f.BreakerWindow, MinRequests: uint32(min(f.BreakerMinRequests, 1<<31)),
			FailureRatio: f.BreakerFailureRatio, OpenTimeout: f.BreakerOpenTimeout, Probes: uint32(min(f.BreakerProbes, 1<<31)), Sustain: f.BreakerSustain},
		OverLimit: guard.OverLimitConfig{Disabled: !f.OverLimitCache, MaxKeys: f.OverLimitCacheKeys},
		HotKeys: guard.HotKeyConfig{Enabled: f.HotKeys, Threshold: f.HotKeyThreshold, SyncInterval: f.HotKeySyncInterval,
			Window: f.HotKeyWindow, MaxKeys: f.HotKeyMax},
	}
}
