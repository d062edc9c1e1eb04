// Building a daemon: Start, and the constructors of the daemon's parts in
// the order Start calls them.

package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoyrls"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/grpcapi"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/policy"
)

// Start builds everything cfg describes, starts listening and serving, and
// returns the running daemon. ctx bounds the start only (connecting to the
// store, the control plane, PostgreSQL); stop the daemon with Shutdown.
//
// Nothing is served before every part is built. When a part cannot be
// built, Start closes those built before it and returns its error.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	d, err := newDaemon(cfg)
	if err != nil {
		return nil, err
	}
	if err := d.build(ctx); err != nil {
		d.abort()
		return nil, err
	}
	d.serve()
	return d, nil
}

// newDaemon returns a daemon of cfg, with cfg's defaults filled in and
// what every part reports to: the logger, the metrics and the audit
// events.
func newDaemon(cfg Config) (*Daemon, error) {
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
	return d, nil
}

// build builds the daemon's parts, each from those before it: the first
// policy, the listeners' certificate, the store, the engine, the control
// plane, the APIs, the listeners and their servers. On an error, the parts
// built so far are left for abort to close.
func (d *Daemon) build(ctx context.Context) error {
	first, loadTook, err := d.loadFirst()
	if err != nil {
		return err
	}
	// A bad certificate fails the start before the store is reached.
	if err := d.startTLS(); err != nil {
		return err
	}
	st, shared, err := d.buildStore(ctx)
	if err != nil {
		return err
	}
	if err := d.buildEngine(ctx, st, first, loadTook); err != nil {
		return err
	}
	if err := d.startControl(ctx); err != nil {
		return err
	}
	a, err := d.buildAPIs(shared)
	if err != nil {
		return err
	}
	if err := d.openListeners(ctx); err != nil {
		return err
	}
	d.buildServers(a)
	return nil
}

// abort closes what build built before it failed. Nothing was served.
func (d *Daemon) abort() {
	if d.keeper != nil {
		d.keeper.Close()
	}
	d.closeSync()
	d.closeControl()
	if d.eng != nil {
		d.eng.Close()
	}
	d.closeAnalytics()
	if d.stopTracing != nil {
		d.stopTracing(context.Background())
	}
	d.closeListeners()
	d.closeCertWatch()
	if d.configWatch != nil {
		d.configWatch.Close()
	}
	if d.closer != nil {
		d.closer()
	}
}

// loadFirst reads and parses the first policy: the configuration file's,
// or the built-in one without a file. It returns the policy and how long
// reading and parsing it took. The file is watched before it is read, so
// that a change made while the daemon starts is applied once it serves.
func (d *Daemon) loadFirst() (*policy.Policy, time.Duration, error) {
	if path := d.cfg.ConfigPath; path != "" {
		w, err := newWatcher(path)
		if err != nil {
			if _, _, lerr := d.loadPolicy(); lerr != nil {
				return nil, 0, lerr // the file's own problem says more
			}
			return nil, 0, err
		}
		d.configWatch = w
	}
	start := time.Now()
	p, data, err := d.loadPolicy()
	if err != nil {
		return nil, 0, err
	}
	d.lastData = data
	return p, time.Since(start), nil
}

// buildStore opens the store Config.StoreURL names and, on Redis, puts the
// guard around it (see guardStore). It returns the store the engine
// decides on, and the store itself, which keeps the reservations too.
func (d *Daemon) buildStore(ctx context.Context) (st, shared engine.Store, err error) {
	shared, closer, err := openStore(ctx, d.cfg.StoreURL, d.cfg.Now, d.cfg.Redis, d.cfg.ExitOnUnavailableStore, d.log, d.reg)
	if err != nil {
		return nil, nil, err
	}
	d.pending, _ = shared.(*pendingRedis)
	// On an error guardStore has closed the store.
	st, d.guard, closer, err = guardStore(ctx, d.cfg.StoreURL, shared, closer, d.cfg.Guard, d.metrics, d.log)
	if err != nil {
		return nil, nil, err
	}
	d.closer = closer
	return st, shared, nil
}

// buildEngine starts what the engine reports to (tracing, the sync of
// global limits, the analytics), builds the engine on st, and puts first
// in force as the first configuration. loadTook is how long reading and
// parsing first took: with the engine's building it is the load's time,
// as a reload's is, without the opening of the store in between.
func (d *Daemon) buildEngine(ctx context.Context, st engine.Store, first *policy.Policy, loadTook time.Duration) error {
	tracer, stopTracing, err := startTracing(&d.cfg)
	if err != nil {
		return err
	}
	d.tracing, d.stopTracing = tracer != nil, stopTracing
	global, err := d.startSync(ctx)
	if err != nil {
		return err
	}
	rec, err := d.startAnalytics(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	cfg := &d.cfg
	d.eng, err = engine.New(engine.Config{Store: st, MaybeCountedFailsClosed: true, Policy: first, Now: cfg.Now, Metrics: d.metrics, Events: d.events,
		Global: global, Analytics: rec, Region: cfg.Region,
		Tracer: tracer, TraceSampleRatio: cfg.TraceSampleRatio, BulkShare: cfg.BulkShare, BulkChecks: cfg.BulkChecks})
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.commit(&configuration{file: first, policy: first}, loadTook+time.Since(start))
	return nil
}

// apis are the daemon's APIs over the engine, before their servers.
type apis struct {
	http  http.Handler     // the JSON API, before the daemon's own routes
	grpc  *grpcapi.Server  // Sluice's gRPC API
	envoy *envoyrls.Server // Envoy's rate limit service
}

// buildAPIs builds the keeper of the reservations, on shared, and the APIs
// over the engine.
func (d *Daemon) buildAPIs(shared engine.Store) (*apis, error) {
	cfg := &d.cfg
	// The APIs take interfaces: a nil Keeper must reach them as nil.
	var resv httpapi.Reservations
	var grpcResv grpcapi.Reservations
	if !cfg.NoReservations {
		var err error
		if d.keeper, err = newKeeper(*cfg, d.eng.Policy, d.events, shared); err != nil {
			return nil, err
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
		return nil, err
	}
	svc, err := grpcapi.New(grpcapi.Config{Engine: d.eng, Now: cfg.Now, AuthorizeReset: d.authorizeReset(), Reservations: grpcResv})
	if err != nil {
		return nil, err
	}
	rls, err := envoyrls.New(d.eng, envoyrls.Config{PreciseReset: cfg.EnvoyPreciseReset, Compat: cfg.EnvoyCompat})
	if err != nil {
		return nil, err
	}
	return &apis{http: api, grpc: svc, envoy: rls}, nil
}
