// The listeners' settings and their closing.

package daemon

import (
	"cmp"
	"math"
	"net/http"
	"time"

	"google.golang.org/grpc/keepalive"
)

// keepaliveParams returns the server's keepalive parameters for
// Config.GRPCKeepalive ka and Config.GRPCMaxConnectionAge age.
func keepaliveParams(ka, age time.Duration) keepalive.ServerParameters {
	var p keepalive.ServerParameters
	switch ka = cmp.Or(ka, DefaultGRPCKeepalive); {
	case ka < 0:
		p.Time = time.Duration(math.MaxInt64) // grpc-go's "never"
	default:
		p.Time, p.Timeout = ka, min(ka, maxKeepaliveTimeout)
	}
	// grpc-go spreads each connection's age by +/-10%, so that the
	// connections opened together are not all closed together.
	if age = cmp.Or(age, DefaultGRPCMaxConnectionAge); age > 0 {
		p.MaxConnectionAge, p.MaxConnectionAgeGrace = age, grpcMaxConnectionAgeGrace
	}
	return p
}

// closeListeners closes every listener opened so far.
func (d *Daemon) closeListeners() {
	if d.httpLn != nil {
		d.httpLn.Close()
	}
	if d.grpcLn != nil {
		d.grpcLn.Close()
	}
	if d.debugLn != nil {
		d.debugLn.Close()
	}
	if d.adminLn != nil {
		d.adminLn.Close()
	}
}

// withDraining answers GET /readyz with 503 once Shutdown has begun,
// before api; the other requests go on to api.
func (d *Daemon) withDraining(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && d.draining.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting_down"})
			return
		}
		api.ServeHTTP(w, r)
	})
}
