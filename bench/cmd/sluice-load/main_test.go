package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

func TestRun(t *testing.T) {
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	// The built-in policy's demo rule admits 5 per minute per client.
	var out, errOut bytes.Buffer
	args := []string{"--addr", d.HTTPAddr(), "--resource", "/api/v1/demo", "--keys", "2",
		"--concurrency", "2", "--requests", "30", "--duration", "20s", "--expect-limit", "5", "--window", "1m", "--json"}
	if code := run(args, &out, &errOut, noEnv); code != 0 {
		t.Fatalf("exit %d: %s %s", code, out.String(), errOut.String())
	}
	var rep struct {
		Requests, Allowed, Denied, Errors int64
		Overshoot                         struct{ Total, Windows int64 }
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Requests != 30 || rep.Errors != 0 || rep.Allowed < 10 || rep.Allowed > 10*rep.Overshoot.Windows || rep.Overshoot.Total != 0 {
		t.Errorf("report %+v: want 30 requests, 10 allowed per window, no overshoot", rep)
	}
	out.Reset()
	if code := run([]string{"--target", "grpc", "--addr", d.GRPCAddr(), "--requests", "10", "--concurrency", "1"}, &out, &errOut, noEnv); code != 0 || !strings.Contains(out.String(), "p99") {
		t.Errorf("grpc text report: exit %d: %s %s", code, out.String(), errOut.String())
	}
	// Too few --conns for the callers and the server's bound on the calls
	// of a connection: a usage error, though found once connected.
	errOut.Reset()
	if code := run([]string{"--target", "envoy", "--addr", d.GRPCAddr(), "--concurrency", "2100", "--conns", "2", "--requests", "1"}, &out, &errOut, noEnv); code != 2 || !strings.Contains(errOut.String(), "give conns 3") {
		t.Errorf("2100 callers over 2 connections: exit %d, %q; want 2 naming the conns needed", code, errOut.String())
	}
	for _, bad := range [][]string{{"--costs", "x"}, {"--target", "smtp"}, {"extra"}, {"--threads", "-1"}} {
		if code := run(bad, &out, &errOut, noEnv); code != 2 {
			t.Errorf("run(%q) = %d, want 2", bad, code)
		}
	}
}

// A zero or negative value of a flag that has no such meaning is a usage
// error naming the flag, not silently the flag's default: --concurrency 0
// used to run 64 callers, --timeout -1s to fail every request at once.
func TestLoadRefusesZeroAndNegativeValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string // named in the error
	}{
		{[]string{"--concurrency", "0"}, "--concurrency"},
		{[]string{"--duration", "0"}, "--duration"},
		{[]string{"--duration", "-1s"}, "--duration"},
		{[]string{"--keys", "0"}, "--keys"},
		{[]string{"--timeout", "0"}, "--timeout"},
		{[]string{"--timeout", "-1s"}, "--timeout"},
		{[]string{"--target", "grpc", "--conns", "0"}, "--conns"},
		{[]string{"--zipf", "--zipf-s", "0"}, "--zipf-s"},
	} {
		var out, errOut bytes.Buffer
		// An address nothing listens on: a run that starts fails fast.
		code := run(append([]string{"--addr", "127.0.0.1:1", "--requests", "1"}, tc.args...), &out, &errOut, noEnv)
		if code != 2 || !strings.Contains(errOut.String(), tc.flag) {
			t.Errorf("sluice-load %q: exit %d, %q; want 2 and an error naming %s", tc.args, code, errOut.String(), tc.flag)
		}
	}
}

// A server that cannot be reached fails the run (exit 1) on every target,
// as the errors of an HTTP run do; exit 2 is for bad usage. The gRPC and
// Envoy targets, which connect before the run, used to exit 2.
func TestLoadUnreachableServer(t *testing.T) {
	for _, target := range []string{"http", "grpc", "envoy"} {
		var out, errOut bytes.Buffer
		code := run([]string{"--target", target, "--addr", "127.0.0.1:1", "--requests", "1", "--concurrency", "1"}, &out, &errOut, noEnv)
		if code != 1 || !strings.Contains(out.String()+errOut.String(), "refused") {
			t.Errorf("sluice-load --target %s at a closed port: exit %d, %q %q; want 1 and the connection's error", target, code, out.String(), errOut.String())
		}
	}
}

// An empty value given for a string flag is the user's, not the flag's
// default: refused, naming the flag, where the run cannot use it
// (--addr "" ran against 127.0.0.1:8080, --target "" drove HTTP, --domain
// "" sent Envoy requests of domain "sluice").
func TestLoadRefusesEmptyValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string // named in the error
	}{
		{[]string{"--addr", ""}, "--addr"},
		{[]string{"--addr", "127.0.0.1:1", "--target", ""}, "--target"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "grpc", "--grpc-client", ""}, "--grpc-client"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "envoy", "--domain", ""}, "--domain"},
		{[]string{"--addr", "127.0.0.1:1", "--target", "envoy", "--descriptor-key", ""}, "--descriptor-key"},
		{[]string{"--addr", "127.0.0.1:1", "--costs", ""}, "--costs"},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"--requests", "1"}, tc.args...), &out, &errOut, noEnv)
		if code != 2 || !strings.Contains(errOut.String(), tc.flag) {
			t.Errorf("sluice-load %q: exit %d, %q; want 2 and an error naming %s", tc.args, code, errOut.String(), tc.flag)
		}
	}
}

// An empty --key-prefix and an empty --resource are sent as given: keys
// named by their numbers alone, checks that name no resource. They used to
// be sent as "load-0" and "/api/v1/orders".
func TestLoadSendsEmptyKeyPrefixAndResource(t *testing.T) {
	bodies := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- string(b)
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	args := []string{"--addr", srv.URL, "--key-prefix", "", "--resource", "", "--keys", "1", "--requests", "1", "--concurrency", "1"}
	if code := run(args, &out, &errOut, noEnv); code != 0 {
		t.Fatalf("exit %d: %s %s", code, out.String(), errOut.String())
	}
	var got struct {
		ClientID string  `json:"client_id"`
		Resource *string `json:"resource"`
	}
	body := <-bodies
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if got.ClientID != "0" || got.Resource == nil || *got.Resource != "" {
		t.Errorf("request %s: want client_id \"0\" and resource \"\"", body)
	}
}

// sluice-load prints its progress on stderr, a line a second with the
// checks so far, their rate and verdicts, unless --quiet.
func TestLoadShowsProgress(t *testing.T) {
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	progress := regexp.MustCompile(`(?m)^load +\d+s: (\d+) checks, \d+/s, (\d+) allowed, (\d+) denied, 0 errors$`)
	args := []string{"--addr", d.HTTPAddr(), "--duration", "2500ms", "--concurrency", "2", "--rate", "200"}
	var out, errOut bytes.Buffer
	if code := run(args, &out, &errOut, noEnv); code != 0 {
		t.Fatalf("exit %d: %s %s", code, out.String(), errOut.String())
	}
	lines := progress.FindAllStringSubmatch(errOut.String(), -1)
	if len(lines) < 2 {
		t.Fatalf("stderr %q: want a progress line a second", errOut.String())
	}
	for _, m := range lines {
		if m[1] == "0" {
			t.Errorf("progress %q: no checks counted", m[0])
		}
	}
	out.Reset()
	errOut.Reset()
	if code := run(append(args[:len(args):len(args)], "--quiet", "--duration", "1500ms"), &out, &errOut, noEnv); code != 0 || errOut.Len() != 0 {
		t.Errorf("--quiet: exit %d, stderr %q; want 0 and nothing", code, errOut.String())
	}
}

func noEnv(string) string { return "" }

// A value a flag cannot take is refused (exit 2) saying what the flag
// wants, from the command line and from the environment alike; help
// exits 0 and names each flag's variable.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--concurrency", "many"}, nil, `--concurrency: "many" is not a whole number; use one such as 64`},
		{[]string{"--rate", "fast"}, nil, `--rate: "fast" is not a number`},
		{[]string{"--timeout", "2"}, nil, `--timeout: "2" is not a duration; use 2ms or 2s`},
		{[]string{"--timeout"}, nil, `--timeout needs a value`},
		{[]string{"--no-such-flag"}, nil, `unknown flag --no-such-flag`},
		{nil, map[string]string{"SLUICE_LOAD_DURATION": "5"}, `SLUICE_LOAD_DURATION: --duration: "5" is not a duration`},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut, func(k string) string { return tc.env[k] })
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("sluice-load %q: exit %d, %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"--help"}, &out, &errOut, noEnv); code != 0 {
		t.Fatalf("--help: exit %d: %s", code, errOut.String())
	}
	for _, w := range []string{"Usage: sluice-load", "SLUICE_LOAD_ADDR", "SLUICE_LOAD_DURATION", "(default 10s)"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("--help does not show %s:\n%s", w, out.String())
		}
	}
}

// --tls-ca, --insecure-skip-verify and an https:// --addr speak TLS to a
// server whose listeners speak TLS alone.
func TestTLSFlags(t *testing.T) {
	pki := redistest.NewPKI(t)
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		TLSCertFile: pki.ServerCertFile, TLSKeyFile: pki.ServerKeyFile})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	for _, args := range [][]string{
		{"--target", "grpc", "--addr", d.GRPCAddr(), "--tls-ca", pki.CAFile},
		{"--target", "envoy", "--addr", "https://" + d.GRPCAddr(), "--insecure-skip-verify", "--domain", "load"},
		{"--target", "grpc", "--addr", d.GRPCAddr(), "--tls-ca", pki.CAFile, "--tls-cert", pki.ClientCertFile, "--tls-key", pki.ClientKeyFile},
		{"--target", "http", "--addr", "https://" + d.HTTPAddr(), "--tls-ca", pki.CAFile, "--resource", "/api/v1/demo"},
		{"--target", "http", "--addr", d.HTTPAddr(), "--insecure-skip-verify", "--resource", "/api/v1/demo"},
	} {
		var out, errOut bytes.Buffer
		args = append(args, "--requests", "4", "--concurrency", "2", "--quiet", "--json")
		if code := run(args, &out, &errOut, noEnv); code != 0 {
			t.Errorf("sluice-load %q: exit %d: %s %s", args, code, out.String(), errOut.String())
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--target", "grpc", "--addr", d.GRPCAddr()}, 1, ""}, // plain gRPC to a TLS listener
		{[]string{"--target", "grpc", "--addr", d.GRPCAddr(), "--tls-ca", pki.ServerKeyFile}, 2, "--tls-ca"},
		{[]string{"--target", "grpc", "--addr", d.GRPCAddr(), "--tls-ca", "/no/such/ca.pem"}, 2, "--tls-ca"},
		{[]string{"--target", "grpc", "--addr", d.GRPCAddr(), "--tls-cert", pki.ClientCertFile}, 2, "--tls-key"},
		{[]string{"--target", "http", "--addr", "http://" + d.HTTPAddr(), "--tls-ca", pki.CAFile}, 2, "https://"},
	} {
		var out, errOut bytes.Buffer
		args := append(tc.args, "--requests", "1", "--concurrency", "1", "--timeout", "2s", "--quiet")
		if code := run(args, &out, &errOut, noEnv); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("sluice-load %q: exit %d, %q; want %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}
