// The listeners and their servers: opened and built by Start, and served
// once every part of the daemon is built.

package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/internal/grpccodec"
	"github.com/sluicehq/sluice/internal/logging"
)

// openListeners opens the debug, HTTP, gRPC and admin listeners, those
// the Config asks for.
func (d *Daemon) openListeners(ctx context.Context) error {
	if err := d.startDebug(ctx); err != nil {
		return err
	}
	var lc net.ListenConfig
	var err error
	if d.httpLn, err = lc.Listen(ctx, "tcp", d.cfg.HTTPAddr); err != nil {
		return fmt.Errorf("daemon: HTTP listener: %w", err)
	}
	if d.grpcLn, err = lc.Listen(ctx, "tcp", d.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("daemon: gRPC listener: %w", err)
	}
	return d.openAdmin(ctx)
}

// buildServers builds the HTTP server of the JSON API (with the daemon's
// own routes before it) and the gRPC server of Sluice's and Envoy's APIs
// and the health service.
func (d *Daemon) buildServers(a *apis) {
	cfg := &d.cfg
	d.httpSrv = &http.Server{
		Handler:           traceHTTP(d.tracing, logging.HTTP(d.log, recoverHTTP(d.log, d.withDraining(d.withUI(d.withSync(d.withEvents(d.withAnalytics(d.withAdmin(a.http))))))))),
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
	d.grpcSrv = grpc.NewServer(d.grpcOptions()...)
	a.grpc.Register(d.grpcSrv)
	a.envoy.Register(d.grpcSrv)
	d.health = health.NewServer()
	healthpb.RegisterHealthServer(d.grpcSrv, d.health)
	if cfg.GRPCReflection {
		reflection.Register(d.grpcSrv)
	}
	if d.waits != nil {
		d.waits.boundMethods(d.grpcSrv)
	}
}

// grpcOptions returns the gRPC server's options, and bounds the
// connections of its listener.
func (d *Daemon) grpcOptions() []grpc.ServerOption {
	cfg := &d.cfg
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
	intercept := recoverUnary(d.log, logUnary(d.log))
	if d.tracing {
		intercept = traceUnary(intercept)
	}
	if bound := cfg.GRPCReadTimeout; bound > 0 {
		d.waits = newRequestWaits(bound)
		intercept = d.waits.unaryInterceptor(intercept)
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
	if d.waits != nil {
		// A unary call's request must come within the read timeout (see
		// requestWaits).
		opts = append(opts, grpc.InTapHandle(d.waits.tap))
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
	return opts
}

// serve starts the background goroutines (the watchers of the
// configuration and of the certificate, the sweep of gRPC requests) and
// the servers on their listeners, until Shutdown. The daemon reports
// itself serving on gRPC health at once, or, when the store did not
// answer at start, once it does.
func (d *Daemon) serve() {
	bg, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	if w := d.waits; w != nil {
		d.wg.Go(func() { w.sweep(bg) })
	}
	if w := d.configWatch; w != nil {
		d.configWatch = nil // watch owns it now
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
	d.serveAdminAddr()
	if d.pending == nil {
		d.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	} else {
		d.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		d.wg.Go(func() { d.awaitStore(bg) })
	}
	d.log.Info("sluice listening", "http", d.HTTPAddr(), "grpc", d.GRPCAddr(),
		"store", redactURL(d.cfg.StoreURL), "config", configName(d.cfg.ConfigPath), "version", d.config.Load().file.Version,
		"analytics", analyticsName(&d.cfg), "tls", d.tls != nil, "client_certs", d.tls != nil && d.tls.ClientCAs != nil)
}
