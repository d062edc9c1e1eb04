// The control plane: its store (the data directory or etcd), the layer it
// applies over the configuration file's policy, and the admin API.

package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/adminapi"
	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/etcdstore"
	"github.com/sluicehq/sluice/internal/control/filestore"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/logging"
	"github.com/sluicehq/sluice/internal/policy"
)

// controlEnabled reports whether cfg asks for a control plane.
func (cfg *Config) controlEnabled() bool { return cfg.DataDir != "" || cfg.ControlStore != "" }

// openBackend opens the control plane's store: etcd when cfg.ControlStore
// names it, else the data directory.
func openBackend(cfg *Config) (control.Backend, error) {
	if cfg.ControlStore == "" {
		s, err := filestore.Open(cfg.DataDir)
		if err != nil {
			return nil, fmt.Errorf("daemon: --data-dir: %w", err)
		}
		return s, nil
	}
	ec, err := etcdstore.ParseURL(cfg.ControlStore)
	if err != nil {
		return nil, fmt.Errorf("daemon: --config-store: %w", err)
	}
	if cfg.ControlTLS != nil {
		ec.TLS = cfg.ControlTLS
	}
	ec.CAFile, ec.CertFile, ec.KeyFile = cfg.ControlCAFile, cfg.ControlCertFile, cfg.ControlKeyFile
	s, err := etcdstore.Open(ec)
	if err != nil {
		return nil, fmt.Errorf("daemon: --config-store: %w", err)
	}
	return s, nil
}

// startControl opens the control plane, which applies its layer over the
// file's policy at once (from its store, or from the data directory's copy
// of the last layer applied when the store cannot be reached), and builds
// the admin API. Without a control plane configured it does nothing.
func (d *Daemon) startControl(ctx context.Context) error {
	cfg := &d.cfg
	if !cfg.controlEnabled() {
		return nil
	}
	b, err := openBackend(cfg)
	if err != nil {
		return err
	}
	d.plane, err = control.Open(ctx, control.Options{
		Backend:  b,
		Instance: cfg.Instance,
		Region:   cfg.Region,
		CacheDir: cfg.DataDir,
		Validate: d.validateLayer,
		Apply:    d.applyLayer,
		Now:      cfg.Now,
		Logger:   d.log,
		Audit:    d.auditEvent,
	})
	if err != nil {
		b.Close()
		return fmt.Errorf("daemon: control plane: %w", err)
	}
	d.backend = b
	var tokens []control.Token
	if cfg.AdminTokensPath != "" {
		if tokens, err = auth.LoadTokens(cfg.AdminTokensPath); err != nil {
			return fmt.Errorf("daemon: --admin-tokens: %w", err)
		}
	}
	if cfg.AdminToken != "" {
		tokens = append(tokens, control.Token{Name: "local-admin", Role: control.RoleAdmin, SHA256: auth.Hash(cfg.AdminToken)})
	}
	d.admin, err = adminapi.New(adminapi.Config{
		Plane:  d.plane,
		Tokens: tokens,
		Limits: d.effectiveLimits,
		Now:    cfg.Now,
		Logger: d.log,
		// A viewer's route, as the admin API's other reads.
		Analytics: d.analyticsHTTP,
	})
	if err != nil {
		return fmt.Errorf("daemon: admin API: %w", err)
	}
	if d.roles, err = auth.New(tokens, d.plane.Tokens); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if cfg.RequireCheckToken {
		d.checkAuth = d.roles
	}
	return nil
}

// authorizeReset admits a ResetLimit of an operator (or admin); without a
// control plane there are no roles, and no ResetLimit.
func (d *Daemon) authorizeReset() func(ctx context.Context) error {
	if d.roles == nil {
		return nil
	}
	return func(ctx context.Context) error { return d.roles.AuthorizeGRPC(ctx, control.RoleOperator) }
}

// closeControl stops the control plane and closes its store.
func (d *Daemon) closeControl() error {
	if d.plane == nil {
		return nil
	}
	err := d.plane.Close()
	if berr := d.backend.Close(); err == nil {
		err = berr
	}
	return err
}

// validateLayer reports whether l would apply over the file's policy in
// force, as applyLayer would apply it, without putting anything in force.
// A layer that would not is bad input, a *control.FieldError (400) naming
// the field of the object at fault as its JSON body does
// ("reservations.quotas[0].weight", "limits.api.window"), or "body".
func (d *Daemon) validateLayer(l *policy.Layer) error {
	c, err := d.compose(d.config.Load().file, l)
	if err == nil {
		err = d.accept(c)
	}
	var le *policy.LayerError
	switch {
	case errors.As(err, &le):
		field := cmp.Or(le.Field, "body")
		return &control.FieldError{Field: field, Msg: fmt.Sprintf("%s (%s %q)", le.Msg, le.Object, le.ID)}
	case errors.Is(err, policy.ErrInvalidConfig), errors.Is(err, sluice.ErrInvalidLimit):
		return &control.FieldError{Field: "body", Msg: err.Error()}
	}
	return err
}

// effectiveLimits answers the limits part of GET /api/v1/{kind}/{id}/limits.
func (d *Daemon) effectiveLimits(kind, value string) any {
	dim := map[string]policy.Dimension{"user": policy.DimUser, "client": policy.DimClient, "api_key": policy.DimAPIKey}[kind]
	p := d.config.Load().policy
	now := time.Now
	if d.cfg.Now != nil {
		now = d.cfg.Now
	}
	return p.EffectiveLimits(dim, value, now())
}

// auditEvent writes a control plane change to the events log.
func (d *Daemon) auditEvent(e control.AuditEntry) {
	d.events.Emit(events.Event{Type: events.ControlChange, Time: e.Time, Severity: events.SeverityInfo,
		Actor: e.Actor.Name, Role: e.Actor.Role, Action: e.Action, Object: e.Object, ObjectID: e.ID,
		Reason: e.Reason, Revision: e.Revision})
}

// adminPaths are the paths the admin API serves; the check API serves the
// rest.
var adminPaths = []string{"/api/v1/rules", "/api/v1/users/", "/api/v1/clients/", "/api/v1/api-keys/",
	"/api/v1/configs", "/api/v1/emergency/", "/api/v1/audit", "/api/v1/tokens", "/api/v1/control/"}

// isAdminPath reports whether the admin API serves path; with a control
// plane, it serves the analytics too.
func (d *Daemon) isAdminPath(path string) bool {
	if path == analyticsPath {
		return d.admin != nil
	}
	for _, p := range adminPaths {
		if path == strings.TrimSuffix(p, "/") || strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// withAdmin routes the admin API's paths to admin (or, without a control
// plane, answers them saying how to turn it on) and the others to api,
// which requires a token first when check tokens are asked for.
func (d *Daemon) withAdmin(api http.Handler) http.Handler {
	if d.checkAuth != nil {
		api = checkTokenHTTP(d.checkAuth, api)
	}
	if d.cfg.AdminAddr != "" {
		return api // the admin API has its own listener
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !d.isAdminPath(r.URL.Path) {
			api.ServeHTTP(w, r)
			return
		}
		d.serveAdmin(w, r)
	})
}

// serveAdmin serves the admin API, or says how to enable it.
func (d *Daemon) serveAdmin(w http.ResponseWriter, r *http.Request) {
	if d.admin == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintln(w, `{"error":"admin_disabled","message":"the admin API needs a control plane: start sluice serve with --data-dir DIR (one instance) or --config-store etcd://host:2379 (many), and --admin-tokens FILE"}`)
		return
	}
	d.admin.ServeHTTP(w, r)
}

// openPaths answer without a token even when the check APIs require one:
// probes and metrics.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// checkTokenHTTP requires a token of any role on the check API's paths.
func checkTokenHTTP(a *auth.Authenticator, next http.Handler) http.Handler {
	guarded := a.RequireCheckToken(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// checkTokenUnary requires a token of any role on gRPC calls but the
// health service's.
func checkTokenUnary(a *auth.Authenticator) grpc.UnaryServerInterceptor {
	require := a.UnaryInterceptor()
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, "/grpc.health.v1.") {
			return handler(ctx, req)
		}
		return require(ctx, req, info, handler)
	}
}

// openAdmin opens the admin API's own listener, and builds its server,
// when AdminAddr asks for one.
func (d *Daemon) openAdmin(ctx context.Context) error {
	if d.cfg.AdminAddr == "" {
		return nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", d.cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("daemon: admin listener: %w", err)
	}
	d.adminLn = ln
	d.adminSrv = &http.Server{
		Handler:           logging.HTTP(d.log, recoverHTTP(d.log, http.HandlerFunc(d.serveAdmin))),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       cmp.Or(d.cfg.HTTPReadTimeout, DefaultHTTPReadTimeout),
		WriteTimeout:      cmp.Or(d.cfg.HTTPWriteTimeout, DefaultHTTPWriteTimeout),
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn), // TLS handshakes refused, among others
	}
	return nil
}

// serveAdminAddr serves the admin API's own listener, if any, until
// Shutdown.
func (d *Daemon) serveAdminAddr() {
	if d.adminLn == nil {
		return
	}
	ln := d.adminLn
	d.wg.Go(func() {
		if err := d.serveHTTP(d.adminSrv, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("admin server stopped", "err", err)
		}
	})
}

// AdminAddr returns the address of the admin API's own listener, or the
// HTTP API's when it has none.
func (d *Daemon) AdminAddr() string {
	if d.adminLn != nil {
		return d.adminLn.Addr().String()
	}
	return d.HTTPAddr()
}

// Plane returns the control plane, nil without one.
func (d *Daemon) Plane() *control.Plane { return d.plane }
