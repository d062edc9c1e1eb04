// Package daemon builds and runs a whole Sluice server from a Config: the
// store, the policy, the engine, the HTTP JSON API, Sluice's gRPC API and
// Envoy's rate limit service, with configuration reload. It starts
// in-process, so tests run complete servers on free ports.
//
// # Lifecycle
//
// A daemon's life is three functions:
//
//   - Start builds everything a Config describes, each part from those
//     before it: the first policy and the listeners' certificate, the
//     store, the engine and what it reports to, the control plane, the
//     APIs, the listeners and their servers (see build.go). Only then does
//     it serve. When a part cannot be built, Start closes those built
//     before it and returns the error.
//   - Apply puts a new policy in force, whole or not at all (see
//     apply.go). The configuration it makes, the policy with the control
//     plane's layer over it, is prepared aside and checked by every part it
//     reaches; only when all accept it is it swapped in, in one step.
//     Otherwise the configuration in force stays and the error shows in the
//     configuration status. Reload, the file watcher and the control plane
//     all apply through it.
//   - Shutdown stops serving, lets the checks in flight finish, stops every
//     background goroutine and closes the store (see stop.go).
//
// The Config (addresses, store, TLS files, limits of the listeners) is
// read by Start only. What a running daemon takes anew is its policy and
// the listeners' certificate, which Reload and the watchers read again.
package daemon

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/sluicehq/sluice/internal/adminapi"
	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/analytics/pganalytics"
	"github.com/sluicehq/sluice/internal/analyticsapi"
	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/globalsync"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/reserve"
)

// Daemon is a running server, made by Start. Its methods are safe for
// concurrent use.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	reg      *prometheus.Registry
	eng      *engine.Engine
	guard    *guard.Guard // nil on the memory store
	closer   func() error // closes the store; nil before it is open
	httpLn   net.Listener
	grpcLn   net.Listener
	httpSrv  *http.Server
	grpcSrv  *grpc.Server
	health   *health.Server
	cancel   context.CancelFunc // stops the background goroutines
	wg       sync.WaitGroup     // the background goroutines
	metrics  *metrics.Metrics
	events   *events.Recorder
	ring     *events.Ring
	changes  *changeSink // the events of changes, to the analytics
	debugLn  net.Listener
	debugSrv *http.Server
	keeper   *reserve.Keeper // nil when reservations are off
	pending  *pendingRedis   // the store, when it did not answer at start; else nil
	waits    *requestWaits   // the bound on gRPC requests' arrival; nil without one

	// Tracing (see trace.go).
	tracing     bool                        // checks are traced
	stopTracing func(context.Context) error // flushes the spans

	// The analytics; nil with Config.NoAnalytics (see analytics.go).
	recorder       *analytics.Recorder
	pganalytics    *pganalytics.Store // nil without Config.AnalyticsURL
	analyticsStore analyticsapi.Store // PostgreSQL's, else the in-process one
	analyticsHTTP  http.Handler       // GET /api/v1/analytics

	// config is the configuration in force (see apply.go): replaced whole
	// by commit, read without a lock.
	config atomic.Pointer[configuration]
	// applyMu serializes the applies: one configuration is prepared and
	// committed at a time.
	applyMu  sync.Mutex
	lastData []byte // the contents last loaded, good or bad; requires applyMu
	// readFailed is set when the last reload could not read the file, so
	// that the next one applies what it reads even when it equals lastData;
	// requires applyMu.
	readFailed bool
	// configWatch watches the configuration file; handed to watch once
	// serving. Nil without a file.
	configWatch *configWatcher

	// mu guards status.
	mu     sync.Mutex
	status httpapi.ConfigStatus

	plane     *control.Plane      // nil without a control plane
	backend   control.Backend     // the plane's store
	admin     *adminapi.Handler   // nil without a control plane
	checkAuth *auth.Authenticator // nil unless RequireCheckToken
	roles     *auth.Authenticator // the admin tokens' roles; nil without a control plane
	adminLn   net.Listener
	adminSrv  *http.Server
	sync      *globalsync.Sync // nil without SyncURL

	// The listeners' TLS (see tls.go); all nil without Config.TLSCertFile.
	tls                 *tls.Config // cloned by each listener
	cert                *servingCert
	certWatch, keyWatch *configWatcher // handed to watchCert once serving

	shutdownOnce sync.Once
	shutdownErr  error
	draining     atomic.Bool // set by Shutdown: GET /readyz answers 503
}

// HTTPAddr returns the address the HTTP API listens on, with the port
// chosen when the configured port was 0.
func (d *Daemon) HTTPAddr() string { return d.httpLn.Addr().String() }

// GRPCAddr returns the address the gRPC APIs listen on.
func (d *Daemon) GRPCAddr() string { return d.grpcLn.Addr().String() }

// Engine returns the daemon's engine.
func (d *Daemon) Engine() *engine.Engine { return d.eng }

// Guard returns the guard around the store, nil on the memory store.
func (d *Daemon) Guard() *guard.Guard { return d.guard }

// Registry returns the registry the daemon's metrics are on.
func (d *Daemon) Registry() *prometheus.Registry { return d.reg }
