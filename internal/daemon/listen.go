// The listeners' settings and their closing.

package daemon

import (
	"cmp"
	"math"
	"time"

	"google.golang.org/grpc/keepalive"
)

// keepaliveParams returns the server's keepalive parameters for
// Config.GRPCKeepalive ka.
func keepaliveParams(ka time.Duration) keepalive.ServerParameters {
	ka = cmp.Or(ka, DefaultGRPCKeepalive)
	if ka < 0 {
		return keepalive.ServerParameters{Time: time.Duration(math.MaxInt64)} // grpc-go's "never"
	}
	return keepalive.ServerParameters{Time: ka, Timeout: min(ka, maxKeepaliveTimeout)}
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
