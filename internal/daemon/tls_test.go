package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/globalsync/natstest"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// clientTLS returns a client configuration trusting pki's CA, presenting
// its client certificate when withCert is set.
func clientTLS(t *testing.T, pki *redistest.PKI, withCert bool) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("no CA certificate")
	}
	tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(pki.ClientCertFile, pki.ClientKeyFile)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc
}

// tlsClients are an HTTP client and a gRPC connection with one TLS
// configuration.
type tlsClients struct {
	http *http.Client
	grpc *grpc.ClientConn
}

func newTLSClients(t *testing.T, td *testDaemon, tc *tls.Config) tlsClients {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	conn, err := grpc.NewClient(td.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return tlsClients{http: &http.Client{Transport: tr, Timeout: 5 * time.Second}, grpc: conn}
}

// checkAll makes a check on each API: HTTP, Sluice's gRPC and Envoy's, and
// GET on the admin listener; it returns the first error.
func (c tlsClients) checkAll(t *testing.T, td *testDaemon) error {
	t.Helper()
	resp, err := c.http.Post("https://"+td.HTTPAddr()+"/api/v1/check", "application/json",
		strings.NewReader(`{"client_id":"t1","resource":"/api/limited"}`))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ratelimit-Limit") != "3" {
		t.Fatalf("HTTP check over TLS: %d %v", resp.StatusCode, resp.Header)
	}
	g, err := sluicev1.NewRateLimiterClient(c.grpc).CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "t1", Resource: "/api/limited"})
	if err != nil {
		return err
	}
	if !g.GetAllowed() || g.GetRule() != "per-client" {
		t.Fatalf("gRPC check over TLS: %v", g)
	}
	e, err := rlsv3.NewRateLimitServiceClient(c.grpc).ShouldRateLimit(ctx(t), envoyReq("edge", 1, []string{"remote_address", "10.0.0.1"}))
	if err != nil {
		return err
	}
	if e.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("Envoy check over TLS: %v", e)
	}
	resp, err = c.http.Get("https://" + td.AdminAddr() + "/api/v1/rules")
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("admin listener over TLS, no token: %d, want 401", resp.StatusCode)
	}
	return nil
}

func tlsDaemon(t *testing.T, pki *redistest.PKI, mod ...func(*daemon.Config)) *testDaemon {
	t.Helper()
	return start(t, policyText(), append([]func(*daemon.Config){func(c *daemon.Config) {
		c.TLSCertFile, c.TLSKeyFile = pki.ServerCertFile, pki.ServerKeyFile
		c.AdminAddr, c.DataDir, c.AdminToken = "127.0.0.1:0", t.TempDir(), "slc_test_token_for_tls"
	}}, mod...)...)
}

// TestTLSListeners checks that the HTTP API, the gRPC and Envoy APIs and the
// admin listener serve TLS with the configured certificate, and only TLS.
func TestTLSListeners(t *testing.T) {
	pki := redistest.NewPKI(t)
	td := tlsDaemon(t, pki)
	if err := newTLSClients(t, td, clientTLS(t, pki, false)).checkAll(t, td); err != nil {
		t.Fatal(err)
	}

	// A client that does not trust the CA is refused by its own check.
	other := newTLSClients(t, td, clientTLS(t, redistest.NewPKI(t), false))
	var unknown x509.UnknownAuthorityError
	if err := other.checkAll(t, td); err == nil || !errors.As(err, &unknown) && !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client of another CA: %v, want an unknown authority", err)
	}
	// Plain HTTP and plain gRPC get no answer.
	if r := get(t, "http://"+td.HTTPAddr()+"/healthz"); r.status != http.StatusBadRequest {
		t.Errorf("plain HTTP to the TLS listener: %d, want 400", r.status)
	}
	if _, err := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr())).CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "t1", Resource: "/"}); err == nil {
		t.Error("plain gRPC to the TLS listener: answered")
	}
	// TLS 1.1 is refused.
	tc := clientTLS(t, pki, false)
	tc.MinVersion, tc.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if c, err := tls.Dial("tcp", td.HTTPAddr(), tc); err == nil {
		c.Close()
		t.Error("TLS 1.1: handshake succeeded")
	}
}

// TestMutualTLS checks that with a client CA every listener refuses a client
// without a certificate, or with one of another CA, and serves one with.
func TestMutualTLS(t *testing.T) {
	pki := redistest.NewPKI(t)
	td := tlsDaemon(t, pki, func(c *daemon.Config) { c.TLSClientCAFile = pki.CAFile })

	if err := newTLSClients(t, td, clientTLS(t, pki, true)).checkAll(t, td); err != nil {
		t.Fatalf("a client with a certificate: %v", err)
	}
	none := newTLSClients(t, td, clientTLS(t, pki, false))
	if err := none.checkAll(t, td); err == nil {
		t.Fatal("a client without a certificate: served")
	}
	// Each listener on its own.
	if _, err := none.http.Get("https://" + td.HTTPAddr() + "/healthz"); err == nil {
		t.Error("HTTP without a client certificate: served")
	}
	if _, err := none.http.Get("https://" + td.AdminAddr() + "/api/v1/rules"); err == nil {
		t.Error("admin without a client certificate: served")
	}
	if _, err := rlsv3.NewRateLimitServiceClient(none.grpc).ShouldRateLimit(ctx(t), envoyReq("edge", 1, []string{"remote_address", "10.0.0.1"})); err == nil {
		t.Error("Envoy API without a client certificate: served")
	}

	// A client certificate of another CA.
	stranger := redistest.NewPKI(t)
	tc := clientTLS(t, pki, false)
	cert, err := tls.LoadX509KeyPair(stranger.ClientCertFile, stranger.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	tc.Certificates = []tls.Certificate{cert}
	if err := newTLSClients(t, td, tc).checkAll(t, td); err == nil {
		t.Error("a client certificate of another CA: served")
	}
}

// TestTLSReload checks that new connections get the certificate written
// over the files, that a certificate without its key leaves the one in
// force, and that the old one's clients are refused after.
func TestTLSReload(t *testing.T) {
	pki := redistest.NewPKI(t)
	td := tlsDaemon(t, pki)
	next := redistest.NewPKI(t)

	// handshake shakes hands with the HTTP listener as a client of p's CA.
	handshake := func(p *redistest.PKI) error {
		c, err := tls.Dial("tcp", td.HTTPAddr(), clientTLS(t, p, false))
		if err != nil {
			return err
		}
		return c.Close()
	}
	if err := handshake(pki); err != nil {
		t.Fatal(err)
	}
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		// Written aside and renamed over, as tools that renew
		// certificates do.
		tmp := filepath.Join(filepath.Dir(to), ".tmp-"+filepath.Base(to))
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, to); err != nil {
			t.Fatal(err)
		}
	}

	// metric returns the line of the metric name on GET /metrics, over
	// TLS with p's CA.
	metric := func(p *redistest.PKI, name string) string {
		c := newTLSClients(t, td, clientTLS(t, p, false))
		resp, err := c.http.Get("https://" + td.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, name+" ") {
				return line
			}
		}
		return ""
	}
	if got := metric(pki, "sluice_tls_cert_last_reload_successful"); got != "sluice_tls_cert_last_reload_successful 1" {
		t.Errorf("at start: %q", got)
	}
	// notAfter returns the expiry of p's server certificate.
	notAfter := func(p *redistest.PKI) int64 {
		pair, err := tls.LoadX509KeyPair(p.ServerCertFile, p.ServerKeyFile)
		if err != nil {
			t.Fatal(err)
		}
		return pair.Leaf.NotAfter.Unix()
	}
	expiry := func(p *redistest.PKI) int64 {
		line := metric(p, "sluice_tls_cert_expiry_timestamp_seconds")
		v, err := strconv.ParseFloat(strings.TrimPrefix(line, "sluice_tls_cert_expiry_timestamp_seconds "), 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return int64(v)
	}
	if got, want := expiry(pki), notAfter(pki); got != want {
		t.Errorf("expiry at start: %d, want %d", got, want)
	}

	// The new certificate without its key: the pair does not load.
	copyFile(next.ServerCertFile, pki.ServerCertFile)
	for deadline := time.Now().Add(5 * time.Second); metric(pki, "sluice_tls_cert_last_reload_successful") != "sluice_tls_cert_last_reload_successful 0"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a certificate without its key: no failed reload within 5s")
		}
	}
	if err := handshake(pki); err != nil {
		t.Fatalf("after a certificate without its key: %v, want the old certificate still", err)
	}

	copyFile(next.ServerKeyFile, pki.ServerKeyFile)
	deadline := time.Now().Add(5 * time.Second)
	for handshake(next) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the new certificate was not served within 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := handshake(pki); err == nil {
		t.Error("the old CA's clients still accepted after the reload")
	}
	if got := metric(next, "sluice_tls_cert_last_reload_successful"); got != "sluice_tls_cert_last_reload_successful 1" {
		t.Errorf("after the reload: %q", got)
	}
	if got, want := expiry(next), notAfter(next); got != want {
		t.Errorf("expiry after the reload: %d, want %d", got, want)
	}
	if err := newTLSClients(t, td, clientTLS(t, next, false)).checkAll(t, td); err != nil {
		t.Errorf("every listener after the reload: %v", err)
	}
}

// TestTLSBadFiles checks that a missing, unreadable or mismatched
// certificate, key or client CA fails the start naming the file.
func TestTLSBadFiles(t *testing.T) {
	pki, other := redistest.NewPKI(t), redistest.NewPKI(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                 string
		cert, key, clientCA  string
		wantOption, wantFile string
	}{
		{"missing cert", missing, pki.ServerKeyFile, "", "TLSCertFile", missing},
		{"cert in a missing directory", filepath.Join(missing, "cert.pem"), pki.ServerKeyFile, "", "TLSCertFile", filepath.Join(missing, "cert.pem")},
		{"garbage cert", garbage, pki.ServerKeyFile, "", "TLSCertFile", garbage},
		{"missing key", pki.ServerCertFile, missing, "", "TLSKeyFile", missing},
		{"garbage key", pki.ServerCertFile, garbage, "", "TLSKeyFile", garbage},
		{"another's key", pki.ServerCertFile, other.ServerKeyFile, "", "TLSKeyFile", other.ServerKeyFile},
		{"missing client CA", pki.ServerCertFile, pki.ServerKeyFile, missing, "TLSClientCAFile", missing},
		{"garbage client CA", pki.ServerCertFile, pki.ServerKeyFile, garbage, "TLSClientCAFile", garbage},
		{"cert without key", pki.ServerCertFile, "", "", "TLSKeyFile", pki.ServerCertFile},
		{"key without cert", "", pki.ServerKeyFile, "", "TLSCertFile", pki.ServerKeyFile},
		{"client CA without cert", "", "", pki.CAFile, "TLSCertFile", pki.CAFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d, err := daemon.Start(ctx, daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
				TLSCertFile: tc.cert, TLSKeyFile: tc.key, TLSClientCAFile: tc.clientCA})
			if err == nil {
				d.Close()
				t.Fatal("started")
			}
			var te *daemon.TLSError
			if !errors.As(err, &te) || te.Option != tc.wantOption || !strings.Contains(err.Error(), tc.wantFile) {
				t.Errorf("got %v, want a TLSError of %s naming %s", err, tc.wantOption, tc.wantFile)
			}
		})
	}
}

// TestNoOperatorHeaders checks that the operators' headers can be left out
// of check answers, and the standard ones stay.
func TestNoOperatorHeaders(t *testing.T) {
	for _, noOps := range []bool{false, true} {
		td := start(t, policyText(), func(c *daemon.Config) { c.NoOperatorHeaders = noOps })
		r := td.check(t, `{"client_id":"h1","resource":"/api/limited"}`)
		if r.status != http.StatusOK || r.str("rule") != "per-client" {
			t.Fatalf("check: %d %s", r.status, r.raw)
		}
		for _, h := range []string{"X-Ratelimit-Decision-Source", "X-Ratelimit-Decision-Latency-Us", "X-Ratelimit-Policy"} {
			if got := r.header.Get(h) != ""; got == noOps {
				t.Errorf("NoOperatorHeaders %v: %s present %v", noOps, h, got)
			}
		}
		for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy"} {
			if r.header.Get(h) == "" {
				t.Errorf("NoOperatorHeaders %v: %s missing", noOps, h)
			}
		}
		hasRule := strings.Contains(r.header.Get("Ratelimit")+r.header.Get("Ratelimit-Policy"), "per-client")
		if hasRule == noOps {
			t.Errorf("NoOperatorHeaders %v: RateLimit %q, RateLimit-Policy %q", noOps, r.header.Get("Ratelimit"), r.header.Get("Ratelimit-Policy"))
		}
	}
}

// TestSyncTLS checks that the regions' sync reaches a NATS server that
// speaks TLS only and requires client certificates, with the CA and the
// client certificate given, and not without the certificate.
func TestSyncTLS(t *testing.T) {
	pki := redistest.NewPKI(t)
	srv, err := natstest.StartTLS(&natstest.TLSOptions{CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile, ClientCAFile: pki.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	region := func(withCert bool) *testDaemon {
		return start(t, syncPolicy, func(c *daemon.Config) {
			c.Region, c.SyncURL, c.SyncCAFile = "eu", srv.URL(), pki.CAFile
			if withCert {
				c.SyncCertFile, c.SyncKeyFile = pki.ClientCertFile, pki.ClientKeyFile
			}
		})
	}
	connected := func(td *testDaemon) bool {
		return strings.Contains(get(t, td.base+"/internal/sync").raw, `"connected":true`)
	}
	with := region(true)
	for deadline := time.Now().Add(10 * time.Second); !connected(with); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not connected to NATS over TLS within 10s: %s", get(t, with.base+"/internal/sync").raw)
		}
	}
	without := region(false)
	time.Sleep(time.Second)
	if connected(without) {
		t.Error("connected to NATS without a client certificate")
	}
}

// TestTLSReloadOnSIGHUP checks that Reload, what SIGHUP calls, reads the
// certificate again without waiting for the watch.
func TestTLSReloadOnSIGHUP(t *testing.T) {
	pki, next := redistest.NewPKI(t), redistest.NewPKI(t)
	td := tlsDaemon(t, pki, func(c *daemon.Config) { c.WatchDebounce = time.Hour })
	for _, f := range [][2]string{{next.ServerCertFile, pki.ServerCertFile}, {next.ServerKeyFile, pki.ServerKeyFile}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := td.Reload(); err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", td.HTTPAddr(), clientTLS(t, next, false))
	if err != nil {
		t.Fatalf("after Reload: %v, want the new certificate", err)
	}
	c.Close()
}
