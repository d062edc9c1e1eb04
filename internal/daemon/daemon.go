// Package daemon builds and runs a whole Sluice server from a Config: the
// store, the policy, the engine, the HTTP JSON API, Sluice's gRPC API and
// Envoy's rate limit service, with configuration reload. It starts
// in-process, so tests run complete servers on free ports.
package daemon

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/internal/adminapi"
	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/analytics/pganalytics"
	"github.com/sluicehq/sluice/internal/analyticsapi"
	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoyrls"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/globalsync"
	"github.com/sluicehq/sluice/internal/grpcapi"
	"github.com/sluicehq/sluice/internal/grpccodec"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/logging"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
)

// Daemon is a running server. Its methods are safe for concurrent use.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	reg      *prometheus.Registry
	eng      *engine.Engine
	guard    *guard.Guard // nil on the memory store
	closer   func() error // closes the store
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

	// Tracing (see trace.go).
	tracing     bool                        // checks are traced
	stopTracing func(context.Context) error // flushes the spans

	// The analytics; nil with Config.NoAnalytics (see analytics.go).
	recorder       *analytics.Recorder
	pganalytics    *pganalytics.Store // nil without Config.AnalyticsURL
	analyticsStore analyticsapi.Store // PostgreSQL's, else the in-process one
	analyticsHTTP  http.Handler       // GET /api/v1/analytics

	// reloadMu serializes reloads.
	reloadMu sync.Mutex
	lastData []byte // the contents last loaded, good or bad; requires reloadMu
	// readFailed is set when the last reload could not read the file, so
	// that the next one applies what it reads even when it equals lastData;
	// requires reloadMu.
	readFailed bool

	// mu guards status.
	mu      sync.Mutex
	status  httpapi.ConfigStatus
	applied *policy.Policy // the policy in force, for the list-change events
	base    *policy.Policy // the configuration file's policy, without the layer
	layer   *policy.Layer  // the control plane's layer in force; nil before any

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

// Start builds everything cfg describes, starts listening and serving, and
// returns the running daemon. ctx bounds the start only (connecting to the
// store); stop the daemon with Shutdown.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = DefaultHTTPAddr
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = DefaultGRPCAddr
	}
	if cfg.StoreURL == "" {
		cfg.StoreURL = DefaultStoreURL
	}
	if cfg.WatchDebounce <= 0 {
		cfg.WatchDebounce = 100 * time.Millisecond
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, reg: cfg.Registry}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.reg == nil {
		d.reg = prometheus.NewRegistry()
		d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	var err error
	if d.metrics, err = metrics.New(d.reg); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d.ring = events.NewRing(cfg.EventRing)
	d.changes = &changeSink{}
	d.events = events.New(events.Config{
		Sinks:   append([]events.Sink{events.NewLogSink(d.log), d.ring, d.changes}, cfg.EventSinks...),
		Metrics: d.metrics,
	})

	// The configuration is watched before it is read, so that a change
	// made while the daemon starts is applied once it serves.
	var w *configWatcher
	if cfg.ConfigPath != "" {
		if w, err = newWatcher(cfg.ConfigPath); err != nil {
			if _, _, rerr := d.loadPolicy(); rerr != nil {
				return nil, rerr // the file's own problem says more
			}
			return nil, err
		}
	}
	closeWatcher := func() {
		if w != nil {
			w.Close()
		}
	}
	loadStart := time.Now()
	pol, data, err := d.loadPolicy()
	if err != nil {
		closeWatcher()
		return nil, err
	}
	// The load's time, as on a reload: reading and parsing here, applying
	// (engine.New) below, and not the store's opening in between.
	loadTook := time.Since(loadStart)
	d.lastData = data
	// A bad certificate fails the start before the store is reached.
	if err := d.startTLS(); err != nil {
		closeWatcher()
		return nil, err
	}
	st, closer, err := openStore(ctx, cfg.StoreURL, cfg.Now, cfg.Redis, cfg.ExitOnUnavailableStore, d.log, d.reg)
	if err != nil {
		d.closeCertWatch()
		closeWatcher()
		return nil, err
	}
	shared := st // reservations live there too
	d.pending, _ = st.(*pendingRedis)
	st, d.guard, closer, err = guardStore(ctx, cfg.StoreURL, st, closer, cfg.Guard, d.metrics, d.log)
	if err != nil {
		d.closeCertWatch()
		closeWatcher()
		return nil, err
	}
	d.closer = closer
	fail := func(err error) (*Daemon, error) {
		if d.keeper != nil {
			d.keeper.Close()
		}
		d.closeSync()
		d.closeControl()
		d.closeAnalytics()
		if d.stopTracing != nil {
			d.stopTracing(context.Background())
		}
		d.closeListeners()
		d.closeCertWatch()
		closeWatcher()
		closer()
		return nil, err
	}
	tracer, stopTracing, err := startTracing(&cfg)
	if err != nil {
		return fail(err)
	}
	d.tracing, d.stopTracing = tracer != nil, stopTracing
	global, err := d.startSync(ctx)
	if err != nil {
		return fail(err)
	}
	rec, err := d.startAnalytics(ctx)
	if err != nil {
		return fail(err)
	}
	applyStart := time.Now()
	d.eng, err = engine.New(engine.Config{Store: st, Policy: pol, Now: cfg.Now, Metrics: d.metrics, Events: d.events,
		EnvoyCompat: cfg.EnvoyCompat, Global: global, Analytics: rec, Region: cfg.Region,
		Tracer: tracer, TraceSampleRatio: cfg.TraceSampleRatio, BulkShare: cfg.BulkShare, BulkChecks: cfg.BulkChecks})
	if err != nil {
		return fail(fmt.Errorf("daemon: %w", err))
	}
	d.base = pol
	d.setApplied(pol, loadTook+time.Since(applyStart))
	if err := d.startControl(ctx); err != nil {
		return fail(err)
	}

	// The APIs take interfaces: a nil Keeper must reach them as nil.
	var resv httpapi.Reservations
	var grpcResv grpcapi.Reservations
	if !cfg.NoReservations {
		if d.keeper, err = newKeeper(cfg, d.eng.Policy, d.events, shared); err != nil {
			return fail(err)
		}
		resv, grpcResv = d.keeper, d.keeper
	}
	var history func(ctx context.Context, client string, now time.Time) (httpapi.History, error)
	if d.recorder != nil {
		history = d.history
	}
	api, err := httpapi.New(httpapi.Config{
		History:      history,
		Reservations: resv,
		Engine:       d.eng,
		Metrics:      promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}),
		ConfigStatus: d.ConfigStatus,
		Breaker:      d.breakerState(),
		Now:          cfg.Now,
		Logger:       d.log,

		NoOperatorHeaders: cfg.NoOperatorHeaders,
	})
	if err != nil {
		return fail(err)
	}
	svc, err := grpcapi.New(grpcapi.Config{Engine: d.eng, Now: cfg.Now, AuthorizeReset: d.authorizeReset(), Reservations: grpcResv})
	if err != nil {
		return fail(err)
	}
	rls, err := envoyrls.New(d.eng, envoyrls.Config{PreciseReset: cfg.EnvoyPreciseReset, Compat: cfg.EnvoyCompat})
	if err != nil {
		return fail(err)
	}

	var lc net.ListenConfig
	if err := d.startDebug(ctx); err != nil {
		return fail(err)
	}
	if d.httpLn, err = lc.Listen(ctx, "tcp", cfg.HTTPAddr); err != nil {
		return fail(fmt.Errorf("daemon: HTTP listener: %w", err))
	}
	if d.grpcLn, err = lc.Listen(ctx, "tcp", cfg.GRPCAddr); err != nil {
		return fail(fmt.Errorf("daemon: gRPC listener: %w", err))
	}
	// Each connection holds goroutines and buffers, and up to
	// maxStreamsPerConn calls whose request may take up to the read
	// timeout to come: without a bound on connections, nothing bounds
	// what they hold.
	// Idle connections do not exhaust the bound: at the bound, the one
	// idle the longest is closed (see connLimit).
	var activity *connActivity
	if n := cmp.Or(cfg.GRPCMaxConns, DefaultGRPCMaxConns); n > 0 {
		cl := newConnLimit(d.grpcLn, n, d.log)
		activity = newConnActivity()
		cl.activity = activity
		d.grpcLn = cl
	}

	d.httpSrv = &http.Server{
		Handler:           traceHTTP(d.tracing, logging.HTTP(d.log, recoverHTTP(d.log, d.withDraining(d.withUI(d.withSync(d.withEvents(d.withAnalytics(d.withAdmin(api))))))))),
		ReadHeaderTimeout: 5 * time.Second,
		// A request whose body stops coming, or a client that stops
		// reading its answers, would otherwise hold its connection and
		// goroutine for ever. A check's request and answer are a few
		// kilobytes, and the guard's deadline bounds its store call.
		ReadTimeout:    cmp.Or(cfg.HTTPReadTimeout, DefaultHTTPReadTimeout),
		WriteTimeout:   cmp.Or(cfg.HTTPWriteTimeout, DefaultHTTPWriteTimeout),
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	intercept := recoverUnary(d.log, logUnary(d.log))
	if d.tracing {
		intercept = traceUnary(intercept)
	}
	var waits *requestWaits
	if bound := cfg.GRPCReadTimeout; bound > 0 {
		waits = newRequestWaits(bound)
		intercept = waits.unaryInterceptor(intercept)
	}
	opts := []grpc.ServerOption{
		// The codec turns invalid UTF-8 in a request into InvalidArgument
		// naming the field, instead of grpc-go's Internal.
		grpc.ForceServerCodecV2(grpccodec.Codec{}),
		grpc.UnaryInterceptor(intercept),
		// Reused workers instead of a goroutine per call: no stack growth
		// per call (about a tenth of the server's CPU on the Envoy path).
		grpc.NumStreamWorkers(uint32(max(128, 32*runtime.GOMAXPROCS(0)))),
		// Fixed 1 MiB flow-control windows, which turn off grpc-go's
		// bandwidth-delay probing: its pings answer a question that
		// messages of a few hundred bytes never ask. 1 to 10% more Envoy
		// checks per second on Redis in six paired load runs
		// (docs/PERFORMANCE.md).
		grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(1 << 20),
		// A bound on the calls one connection may have open at once (grpc-go
		// has none): a call whose message does not come holds its handler
		// until the read timeout, and grpc-go's defence against streams
		// reset as soon as opened limits the handlers of a connection to
		// this number.
		// Envoy opens another connection when it needs more; a grpc-go
		// client queues its calls.
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		// A bound on a call's metadata, as HTTP/2 counts it (each field's
		// name and value, plus 32 bytes); grpc-go's default is 16 MiB.
		// HPACK lets a client send a field once and then refer to it in a
		// byte, and grpc-go keeps about 110 bytes per field received, so a
		// call of a few hundred kilobytes held tens of megabytes until its
		// message came. A check's metadata is a few hundred bytes; 16 KiB
		// leaves room for tracing and authentication headers.
		grpc.MaxHeaderListSize(maxHeaderListSize),
		// A dead client's connection, and the calls on it, are closed
		// within a minute and a half rather than grpc-go's two hours and
		// more. Clients may ping every 5s, with or without calls open:
		// grpc-go's default (every 5 minutes, and only with calls open)
		// disconnects an Envoy whose connection keepalive pings an idle
		// connection more often.
		grpc.KeepaliveParams(keepaliveParams(cfg.GRPCKeepalive, cfg.GRPCMaxConnectionAge)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minClientPing, PermitWithoutStream: true}),
	}
	if waits != nil {
		// A unary call's request must come within the read timeout (see
		// requestWaits).
		opts = append(opts, grpc.InTapHandle(waits.tap))
	}
	if activity != nil {
		opts = append(opts, grpc.StatsHandler(activity))
	}
	if d.checkAuth != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(checkTokenUnary(d.checkAuth)))
	}
	if d.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(d.tls)))
	}
	d.grpcSrv = grpc.NewServer(opts...)
	svc.Register(d.grpcSrv)
	rls.Register(d.grpcSrv)
	d.health = health.NewServer()
	healthpb.RegisterHealthServer(d.grpcSrv, d.health)
	if cfg.GRPCReflection {
		reflection.Register(d.grpcSrv)
	}

	bg, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	if waits != nil {
		waits.boundMethods(d.grpcSrv)
		d.wg.Go(func() { waits.sweep(bg) })
	}
	if w != nil {
		d.wg.Go(func() { d.watch(bg, w) })
	}
	if d.certWatch != nil {
		cw, kw := d.certWatch, d.keyWatch
		d.certWatch, d.keyWatch = nil, nil // watchCert owns them now
		d.wg.Go(func() { d.watchCert(bg, cw, kw) })
	}
	httpLn, grpcLn := d.httpLn, d.grpcLn
	d.wg.Go(func() {
		if err := d.serveHTTP(d.httpSrv, httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("HTTP server stopped", "err", err)
		}
	})
	d.wg.Go(func() {
		if err := d.grpcSrv.Serve(grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			d.log.Error("gRPC server stopped", "err", err)
		}
	})
	d.serveDebug()
	if err := d.serveAdminAddr(ctx); err != nil {
		d.closeListeners()
		return nil, err
	}
	if d.pending == nil {
		d.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	} else {
		d.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		d.wg.Go(func() { d.awaitStore(bg) })
	}
	d.log.Info("sluice listening", "http", d.HTTPAddr(), "grpc", d.GRPCAddr(),
		"store", redactURL(cfg.StoreURL), "config", configName(cfg.ConfigPath), "version", pol.Version,
		"analytics", analyticsName(&cfg), "tls", d.tls != nil, "client_certs", d.tls != nil && d.tls.ClientCAs != nil)
	return d, nil
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

// Shutdown stops the daemon gracefully: it reports itself not ready and,
// after Config.ShutdownDelay, stops accepting connections,
// lets the checks in flight finish until ctx ends (then cuts them off),
// stops every background goroutine and waits for it, and closes the store.
// Calling it again returns the first call's result.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.shutdownOnce.Do(func() { d.shutdownErr = d.shutdown(ctx) })
	return d.shutdownErr
}

func (d *Daemon) shutdown(ctx context.Context) error {
	d.health.Shutdown()
	d.draining.Store(true)
	if delay := d.cfg.ShutdownDelay; delay > 0 {
		d.log.Info("not ready; serving on before closing the listeners", "for", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	d.cancel()
	var errs []error
	grpcDone := make(chan struct{})
	go func() {
		d.grpcSrv.GracefulStop()
		close(grpcDone)
	}()
	if err := d.httpSrv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("daemon: HTTP shutdown: %w", err))
		d.httpSrv.Close()
	}
	select {
	case <-grpcDone:
	case <-ctx.Done():
		d.grpcSrv.Stop()
		<-grpcDone
		errs = append(errs, fmt.Errorf("daemon: gRPC shutdown: %w", ctx.Err()))
	}
	if d.debugSrv != nil {
		d.debugSrv.Close()
	}
	if d.adminSrv != nil {
		d.adminSrv.Close()
	}
	d.wg.Wait()
	if d.keeper != nil {
		d.keeper.Close()
	}
	if err := d.closeControl(); err != nil {
		errs = append(errs, fmt.Errorf("daemon: closing the control plane: %w", err))
	}
	d.eng.Close()
	// No check runs any more: what the recorder holds is written now.
	d.closeAnalytics()
	// Spans a collector did not take are lost, not a failed shutdown.
	if err := d.stopTracing(ctx); err != nil {
		d.log.Warn("tracing: spans not flushed to the collector", "err", err)
	}
	if err := d.closeSync(); err != nil {
		errs = append(errs, fmt.Errorf("daemon: closing the sync: %w", err))
	}
	if err := d.closer(); err != nil {
		errs = append(errs, fmt.Errorf("daemon: closing the store: %w", err))
	}
	d.log.Info("sluice stopped")
	return errors.Join(errs...)
}

// Close stops the daemon at once, cutting off checks in flight.
func (d *Daemon) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return d.Shutdown(ctx)
}
