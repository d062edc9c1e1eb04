// The daemon's configuration and its defaults.

package daemon

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/guard"
)

// Defaults of Config.
const (
	DefaultHTTPAddr = "127.0.0.1:8080"
	DefaultGRPCAddr = "127.0.0.1:8081"
	DefaultStoreURL = "memory://"
)

// Defaults of the HTTP API's timeouts (Config.HTTPReadTimeout and
// Config.HTTPWriteTimeout).
const (
	DefaultHTTPReadTimeout  = 10 * time.Second
	DefaultHTTPWriteTimeout = 15 * time.Second
)

// Defaults of the gRPC listener's bounds (Config.GRPCMaxConns,
// Config.GRPCKeepalive and Config.GRPCMaxConnectionAge).
const (
	DefaultGRPCMaxConns         = 10000
	DefaultGRPCKeepalive        = time.Minute
	DefaultGRPCMaxConnectionAge = 5 * time.Minute
)

// grpcMaxConnectionAgeGrace is how long the calls of a gRPC connection
// past its maximum age may take to finish before it is closed. A check
// takes milliseconds; the grace bounds the streams (health Watch), which
// their clients open again.
const grpcMaxConnectionAgeGrace = 10 * time.Second

// Keepalive of the gRPC listener: how long a client's ping may take to be
// answered at most, and how often a client may ping.
const (
	maxKeepaliveTimeout = 20 * time.Second
	minClientPing       = 5 * time.Second
)

// Bounds of the gRPC listener: the calls one connection may have open at
// once, and the size of a call's metadata as HTTP/2 counts it.
const (
	maxStreamsPerConn = 1024
	maxHeaderListSize = 16 << 10
)

// Config configures a daemon. The zero value serves the built-in policy
// on the memory store at the default addresses.
type Config struct {
	// HTTPAddr is the listen address of the HTTP JSON API; empty means
	// DefaultHTTPAddr. Port 0 picks a free port (see Daemon.HTTPAddr).
	HTTPAddr string
	// GRPCAddr is the listen address of the gRPC APIs (Sluice's and
	// Envoy's); empty means DefaultGRPCAddr. Port 0 picks a free port.
	GRPCAddr string
	// TLSCertFile and TLSKeyFile are the PEM files of the certificate
	// (with its intermediates) and the key every listener serves TLS 1.2
	// or later with: the HTTP API (and the UI and /metrics on it), the
	// gRPC and Envoy APIs, the admin listener and the debug listener.
	// Empty: plain TCP. The files are read again when they change (and on
	// Reload); a pair that fails to load leaves the one in force. Start
	// fails with a *TLSError naming the file at fault.
	TLSCertFile, TLSKeyFile string
	// TLSClientCAFile, with TLSCertFile, is a PEM file of the CAs of the
	// client certificates every listener then requires and verifies
	// (mutual TLS); a client without one is refused during the handshake.
	// Read at start only.
	TLSClientCAFile string
	// NoOperatorHeaders leaves out of the HTTP API's answers the headers
	// meant for operators (decision source and latency, rule and tier
	// names, throttles, shadow decisions; see httpapi.Config), keeping the
	// standard rate-limit headers.
	NoOperatorHeaders bool
	// OTLPEndpoint is the host:port of an OpenTelemetry collector that
	// receives the checks' spans over OTLP/gRPC, without TLS; empty means
	// no tracing, at no cost to the checks (see trace.go).
	OTLPEndpoint string
	// TraceSampleRatio is the share, from 0 to 1, of the checks traced
	// among those whose caller sent no trace context; a caller's trace is
	// followed, sampled or not. Zero traces only the callers' sampled
	// traces. `sluice serve` defaults it to 0.01.
	TraceSampleRatio float64
	// Tracing, when set, is the tracer provider of the checks' spans
	// instead of an OTLP one (for tests and embedders), sampled by
	// TraceSampleRatio too: its own sampler should keep every span it is
	// asked for (ParentBased(AlwaysSample)). The daemon does not shut it
	// down.
	Tracing trace.TracerProvider
	// ConfigPath is the policy file (Sluice's YAML or envoyproxy/ratelimit's),
	// or a directory of envoyproxy/ratelimit files, each with its domain
	// (see policy.Read). Empty means the built-in example policy, and no
	// reload.
	ConfigPath string
	// MergeDomains lets several files of a configuration directory hold
	// one Envoy domain, whose descriptors are then merged (see
	// policy.Options).
	MergeDomains bool
	// StoreURL selects the store: memory://, redis://host:port[/db],
	// redis-cluster://host:port,host:port,... (rediss:// and
	// rediss-cluster:// for TLS) or
	// redis-sentinel://host:26379,.../master[/db] (see docs/redis.md).
	// Empty means memory://.
	StoreURL string
	// Logger receives the daemon's logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the daemon's metrics and is served on GET
	// /metrics; nil means a new registry with the Go and process
	// collectors.
	Registry *prometheus.Registry
	// DebugAddr is the listen address of the debug listener (pprof under
	// /debug/pprof/, and /metrics); empty means none. It must be a
	// loopback address unless DebugAllowRemote is set.
	DebugAddr string
	// DebugAllowRemote lets DebugAddr be a non-loopback address.
	DebugAllowRemote bool
	// EventRing is how many audit events GET /api/v1/events keeps; zero
	// means 1000.
	EventRing int
	// EventSinks receive the audit events besides the log and the ring.
	EventSinks []events.Sink
	// Now is the clock of the engine and the APIs; nil means time.Now.
	Now func() time.Time
	// WatchDebounce is how long the file watcher waits after the last
	// change in the configuration's directory before reloading it, and
	// a tenth of the longest it waits after the first (another file of
	// the directory may keep changing); zero means 100ms.
	WatchDebounce time.Duration
	// Redis holds the connection settings of a Redis store; zero fields
	// take the store's defaults.
	Redis RedisOptions
	// HTTPReadTimeout bounds the reading of one HTTP request, headers and
	// body; zero means DefaultHTTPReadTimeout. HTTPWriteTimeout bounds the
	// writing of one answer, from the end of its request's headers; zero
	// means DefaultHTTPWriteTimeout. The write timeout should be the
	// longer, so that a request cut off for its slow body is still
	// answered.
	HTTPReadTimeout, HTTPWriteTimeout time.Duration
	// GRPCReadTimeout bounds the wait for the request of one unary gRPC
	// call, from its headers to its message and the client's half-close:
	// a call whose request has not come by then ends with
	// DeadlineExceeded. Zero or negative means no bound (the default: the
	// bound costs every unary call about 5% more CPU; see
	// docs/operations.md). Streaming calls (health Watch, reflection) are
	// not bounded.
	GRPCReadTimeout time.Duration
	// GRPCMaxConns bounds the gRPC connections open at once: at the bound,
	// the connection idle the longest (no call in flight for a second) is
	// closed to make room; when none is idle, new connections wait (in
	// the kernel's accept queue) until one closes or becomes idle.
	// Zero means DefaultGRPCMaxConns; negative, no bound.
	GRPCMaxConns int
	// GRPCKeepalive is how long a gRPC connection may receive nothing
	// before the server pings the client (1s at least); a connection whose
	// ping is not answered within 20s, or GRPCKeepalive when that is
	// shorter, is closed, and so is one whose data the client does not
	// acknowledge for as long (the socket's TCP_USER_TIMEOUT). Zero means
	// DefaultGRPCKeepalive; negative, no pings.
	GRPCKeepalive time.Duration
	// GRPCMaxConnectionAge is how long a gRPC connection may live: then
	// the server sends it a GOAWAY, lets its calls finish (10s at most)
	// and closes it, and the client opens another, which its balancer may
	// send to another instance. Without it, clients such as Envoy keep
	// their connections to the instances that were up when they
	// connected, and instances added by a scale-up get none of their
	// checks. Each connection's age is spread by +/-10%. Zero means
	// DefaultGRPCMaxConnectionAge; negative, no maximum.
	GRPCMaxConnectionAge time.Duration
	// GRPCReflection serves gRPC server reflection (grpc.reflection.v1
	// and v1alpha) on the gRPC address, for tools such as grpcurl. Off by
	// default: it lists every service and message to whoever reaches the
	// address.
	GRPCReflection bool
	// EnvoyCompat answers Envoy's API as envoyproxy/ratelimit does where
	// Sluice differs (docs/api.md, "Differences from
	// envoyproxy/ratelimit"): descriptors decided each on its own, refused
	// hits counted on fixed windows, limit_remaining 0 when over the
	// limit, a descriptor with no entries not limited. Every instance
	// sharing a store should set it alike.
	EnvoyCompat bool
	// BulkShare is the share of the time and of the CPUs, above 0 and at
	// most 1, that requests of more than BulkChecks checks (batches, Envoy calls) may
	// take while they contend with smaller ones (engine.Config.BulkShare).
	// Zero means 0.1; 1 turns the bound off.
	BulkShare float64
	// BulkChecks is the most checks (or Envoy descriptors) of a request
	// that BulkShare leaves alone; zero means 16.
	BulkChecks int
	// EnvoyPreciseReset reports Envoy's duration_until_reset to the
	// microsecond instead of in whole seconds.
	EnvoyPreciseReset bool
	// ShutdownDelay is how long Shutdown keeps serving, not ready (GET
	// /readyz 503, gRPC health NOT_SERVING), before it stops accepting
	// connections: long enough for the load balancers (a Kubernetes
	// Service's endpoints, Envoy's health checks) to stop sending new
	// checks, which would otherwise find the listeners closed. Shutdown's
	// context bounds the delay and the drain of the checks in flight
	// together. Zero means none.
	ShutdownDelay time.Duration
	// ExitOnUnavailableStore makes Start fail when a Redis store does not
	// answer. By default the daemon starts anyway: it decides checks by
	// the rules' failure modes, reports not ready (GET /readyz 503, gRPC
	// health NOT_SERVING) and connects in the background, every half
	// second at most, until the store answers (docs/operations.md,
	// "Start-up"). A store refusing the daemon's certificate or password
	// makes Start fail either way.
	ExitOnUnavailableStore bool
	// Guard configures what protects checks from a failing Redis store:
	// the per-call deadline, the circuit breaker, the over-limit cache and
	// the hot-key tier (see package guard). It does not apply to the
	// memory store.
	Guard guard.Config

	// DataDir is the local data directory: the control plane's objects
	// when ControlStore is empty (one instance), and in any case the last
	// layer the control plane applied, served after a restart while its
	// store cannot be reached. Empty with ControlStore empty: no control
	// plane, and the admin API says how to turn it on.
	DataDir string
	// ControlStore is the control plane's shared store,
	// etcd://host:2379[,host:2379...][/prefix] (etcds:// for TLS, with
	// ControlTLS); empty keeps the objects in DataDir.
	ControlStore string
	// ControlTLS is the TLS configuration to reach an etcds:// store;
	// nil means TLS 1.2 or later with the system's roots.
	ControlTLS *tls.Config
	// ControlCAFile is a PEM file of the CAs of an etcds:// store's
	// certificates, trusted instead of the system's roots; empty: those
	// of ControlTLS.
	ControlCAFile string
	// ControlCertFile and ControlKeyFile are the PEM files of a client
	// certificate and its key, for an etcds:// store that requires one.
	ControlCertFile, ControlKeyFile string
	// Instance names this instance in the control plane (GET
	// /api/v1/configs/{id} lists those that lag); empty means host
	// name and process id.
	Instance string
	// Region is this instance's region, for emergency throttles of scope
	// region.
	Region string
	// AdminTokensPath is the file of admin tokens, by hash (see
	// docs/operations.md).
	AdminTokensPath string
	// AdminToken is a token given the admin role besides those of the
	// file, such as the one `sluice serve` generates for a loopback
	// listener; empty means none.
	AdminToken string
	// AdminAddr, when set, serves the admin API on its own listener
	// instead of the HTTP API's.
	AdminAddr string
	// RequireCheckToken makes the check APIs (HTTP, gRPC and Envoy's)
	// require a valid token of any role.
	RequireCheckToken bool
	// SyncURL is the NATS server(s) through which the regions share the
	// counts of global limits, nats://host:4222[,nats://...]; empty
	// decides global limits as if this region were alone. Needs Region.
	SyncURL string
	// SyncCAFile is a PEM file of the CAs of the NATS servers'
	// certificates, trusted instead of the system's roots; setting it (or
	// SyncCertFile) speaks TLS to NATS whatever SyncURL's scheme
	// (tls://host:4222 alone uses the system's roots).
	SyncCAFile string
	// SyncCertFile and SyncKeyFile are the PEM files of a client
	// certificate and its key, for NATS servers that verify clients.
	SyncCertFile, SyncKeyFile string
	// SyncPeers are the other regions sharing global limits. Each counts
	// as not heard from (at its share of each limit) until it is, so
	// that a region cut off from its start keeps to its share; empty
	// learns the regions from their messages.
	SyncPeers []string
	// NoReservations turns off the reservations of capacity
	// (/api/v1/reserve and the reservation_id of checks). They are on by
	// default, their pools kept where the counts are: in process on the
	// memory store, in Redis on a Redis or Redis Cluster store, where
	// every instance shares them.
	NoReservations bool

	// NoAnalytics turns off the analytics: no decision is recorded, and
	// GET /api/v1/analytics answers 404. By default every decision is
	// counted, per minute, in an in-process store of the last 24 hours.
	NoAnalytics bool
	// AnalyticsURL is a PostgreSQL connection string,
	// postgres://user:password@host:5432/db: the analytics are written
	// there too (migrated at start, partitioned by day) and answered from
	// there. Empty keeps them in process only.
	AnalyticsURL string
	// AnalyticsRetention is how long PostgreSQL keeps the analytics; zero
	// means DefaultAnalyticsRetention (30 days). Old days are dropped
	// whole, every hour.
	AnalyticsRetention time.Duration
	// AnalyticsFlushInterval is how often the analytics are written to
	// PostgreSQL; zero means 10s.
	AnalyticsFlushInterval time.Duration
	// AnalyticsMaxBacklog bounds the rollups, and the blocked checks,
	// kept for PostgreSQL while it fails; zero means 100,000 of each.
	// Beyond it the oldest are dropped and counted as the gap.
	AnalyticsMaxBacklog int
}
