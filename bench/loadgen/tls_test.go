package loadgen_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestTLS drives a server whose listeners speak TLS alone, on every
// target and client, trusting its CA; without TLS, or trusting another
// CA, every request fails.
func TestTLS(t *testing.T) {
	pki := redistest.NewPKI(t)
	d := startPolicy(t, testPolicy, func(c *daemon.Config) {
		c.TLSCertFile, c.TLSKeyFile = pki.ServerCertFile, pki.ServerKeyFile
	})
	trust := func(caFile string) *tls.Config {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	stranger := trust(redistest.NewPKI(t).CAFile)
	for _, tt := range []struct {
		target, addr, client string
	}{
		{loadgen.TargetHTTP, d.HTTPAddr(), ""},
		{loadgen.TargetHTTP, "https://" + d.HTTPAddr(), ""},
		{loadgen.TargetGRPC, d.GRPCAddr(), loadgen.ClientH2},
		{loadgen.TargetEnvoy, d.GRPCAddr(), loadgen.ClientH2},
		{loadgen.TargetGRPC, d.GRPCAddr(), loadgen.ClientXNet},
		{loadgen.TargetEnvoy, d.GRPCAddr(), loadgen.ClientGRPCGo},
	} {
		name := tt.target + "-" + tt.client
		t.Run(name, func(t *testing.T) {
			cfg := loadgen.Config{
				Target: tt.target, Addr: tt.addr, GRPCClient: tt.client, Concurrency: 2, Requests: 20,
				Duration: 30 * time.Second, KeyPrefix: "tls-" + name + "-", Domain: "load", Resource: "/api/v1/orders",
				Timeout: 5 * time.Second, TLS: trust(pki.CAFile),
			}
			rep, err := loadgen.Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != 20 || rep.Errors != 0 || rep.Allowed == 0 {
				t.Errorf("over TLS: requests %d allowed %d errors %d (%v); want 20 answered", rep.Requests, rep.Allowed, rep.Errors, rep.ErrorSamples)
			}
			for _, bad := range []*tls.Config{nil, stranger} {
				if bad == nil && tt.addr[0] == 'h' {
					continue // an https URL speaks TLS without a configuration
				}
				cfg.TLS, cfg.Requests, cfg.Timeout = bad, 2, time.Second
				rep, err := loadgen.Run(context.Background(), cfg)
				if err == nil && rep.Errors == 0 {
					t.Errorf("TLS %v: %d requests answered, want none", bad != nil, rep.Requests)
				}
			}
		})
	}
}
