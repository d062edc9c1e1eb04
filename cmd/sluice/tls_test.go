package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// A bad certificate or key of the listeners fails the start, naming the
// flag and the file.
func TestServeTLSBadFiles(t *testing.T) {
	pki, other := redistest.NewPKI(t), redistest.NewPKI(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--tls-cert", missing, "--tls-key", pki.ServerKeyFile}, nil, `--tls-cert "` + missing + `"`},
		{[]string{"--tls-cert", pki.ServerCertFile, "--tls-key", other.ServerKeyFile}, nil, `--tls-key "` + other.ServerKeyFile + `": not a private key of the certificate`},
		{[]string{"--tls-cert", pki.ServerCertFile}, nil, `--tls-key: missing`},
		{[]string{"--tls-cert", pki.ServerCertFile, "--tls-key", pki.ServerKeyFile}, map[string]string{"SLUICE_TLS_CLIENT_CA": missing}, `--tls-client-ca "` + missing + `"`},
	} {
		var out bytes.Buffer
		args := append([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, tc.args...)
		code := run(args, &out, &out, func(k string) string { return tc.env[k] })
		// The log quotes the error: its quotes come escaped.
		if msg := strings.ReplaceAll(out.String(), `\"`, `"`); code != 1 || !strings.Contains(msg, tc.want) {
			t.Errorf("serve %q %v: exit %d, %q; want 1 and %q", tc.args, tc.env, code, out.String(), tc.want)
		}
	}
}

// check and admin reach a server that serves TLS: HTTP at an https://
// address and Envoy's API with --tls, trusting the server's CA of
// --tls-ca (or SLUICE_TLS_CA), and with a client certificate when the
// server requires one; without them they cannot answer (exit 3), and
// http:// to it is a usage error the server names (exit 2).
func TestClientTLS(t *testing.T) {
	pki := redistest.NewPKI(t)
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		ConfigPath: "../../examples/envoy-ratelimit.yaml", DataDir: t.TempDir(), AdminToken: "t0ken-for-the-test",
		TLSCertFile: pki.ServerCertFile, TLSKeyFile: pki.ServerKeyFile, TLSClientCAFile: pki.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	httpCheck := []string{"check", "--addr", "https://" + d.HTTPAddr(), "--client-id", "tls", "--resource", "/r", "--timeout", "3s"}
	envoyCheck := []string{"check", "--target", "envoy", "--grpc-addr", d.GRPCAddr(), "--domain", "edge",
		"--descriptor", "remote_address=10.0.0.1", "--timeout", "3s"}
	status := []string{"admin", "status", "--addr", "https://" + d.HTTPAddr(), "--token", "t0ken-for-the-test"}
	ca := []string{"--tls-ca", pki.CAFile}
	cert := []string{"--tls-client-cert", pki.ClientCertFile, "--tls-client-key", pki.ClientKeyFile}
	join := func(parts ...[]string) []string { return slices.Concat(parts...) }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string // in stderr
	}{
		{"http", join(httpCheck, ca, cert), nil, 0, ""},
		{"http, CA and certificate from the environment", httpCheck,
			map[string]string{"SLUICE_TLS_CA": pki.CAFile, "SLUICE_TLS_CLIENT_CERT": pki.ClientCertFile, "SLUICE_TLS_CLIENT_KEY": pki.ClientKeyFile}, 0, ""},
		{"http, unverified", join(httpCheck, cert, []string{"--insecure-skip-verify"}), nil, 0, ""},
		{"http, the server's CA unknown", join(httpCheck, cert), nil, 3, "certificate"},
		{"http, no client certificate", join(httpCheck, ca), nil, 3, ""},
		{"http, plain TCP", join([]string{"check", "--addr", "http://" + d.HTTPAddr(), "--client-id", "tls"}), nil, 2, "HTTPS server"},
		{"envoy", join(envoyCheck, ca, cert), nil, 0, ""},
		{"envoy, --tls and the CA from the environment", join(envoyCheck, []string{"--tls"}, cert), map[string]string{"SLUICE_TLS_CA": pki.CAFile}, 0, ""},
		{"envoy, plain TCP", envoyCheck, nil, 3, ""},
		{"envoy, no client certificate", join(envoyCheck, ca), nil, 3, ""},
		{"admin", join(status, ca, cert), nil, 0, ""},
		{"admin, the server's CA unknown", join(status, cert), nil, 3, "certificate"},
		{"a CA file missing", join(httpCheck, []string{"--tls-ca", filepath.Join(t.TempDir(), "none.pem")}), nil, 2, "--tls-ca"},
		{"a CA file of no certificate", join(httpCheck, []string{"--tls-ca", pki.ClientKeyFile}), nil, 2, "--tls-ca"},
		{"a certificate without its key", join(httpCheck, ca, []string{"--tls-client-cert", pki.ClientCertFile}), nil, 2, "needs --tls-client-key"},
		{"admin, a certificate without its key", join(status, ca, []string{"--tls-client-cert", pki.ClientCertFile}), nil, 2, "needs --tls-client-key"},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut, func(k string) string { return tc.env[k] })
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%s: sluice %q: exit %d, %q %q; want %d and %q", tc.name, tc.args, code, out.String(), errOut.String(), tc.code, tc.want)
		}
	}
}
