package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
)

func noEnv(string) string { return "" }

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("version: 1\nrules:\n  - id: r\n    match: { resource: /a }\n    dimension: client\n    algorithm: gcra\n    limit: 5\n    window: 1s\n"), 0o644)
	os.WriteFile(bad, []byte("version: 1\nrules:\n  - id: r\n    match: { resource: /a }\n    dimension: client\n    algorithm: gcra\n    limit: -5\n    window: 1s\n"), 0o644)
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "validate", good, "../../examples/sluice.yaml", "../../examples/envoy-ratelimit.yaml"}, &out, &errOut, noEnv); code != 0 {
		t.Fatalf("valid files: exit %d, %s", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"config", "validate", bad}, &out, &errOut, noEnv); code != 1 ||
		!strings.Contains(errOut.String(), "bad.yaml") || !strings.Contains(errOut.String(), "limit") {
		t.Errorf("invalid file: exit %d, %q; want 1 and an error naming the file and the field", code, errOut.String())
	}
	for _, args := range [][]string{{}, {"nope"}, {"config"}, {"check"}} {
		if code := run(args, &out, &errOut, noEnv); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
	}
}

func TestConfigValidateDirectory(t *testing.T) {
	dir := "../../internal/policy/testdata/envoy/merge" // two files of one domain
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "validate", dir}, &out, &errOut, noEnv); code != 1 ||
		!strings.Contains(errOut.String(), "duplicate domain") {
		t.Errorf("without merging: exit %d, %q; want 1 and a duplicate domain", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"config", "validate", "--merge-domain-config", dir}, &out, &errOut, noEnv); code != 0 {
		t.Errorf("with --merge-domain-config: exit %d, %s", code, errOut.String())
	}
}

// TestConfigValidateDeepNesting checks that a small file of deeply nested
// descriptors with a long anchored key is rejected without exhausting
// memory.
func TestConfigValidateDeepNesting(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: &k " + strings.Repeat("k", 64<<10) + "\n    descriptors:\n")
	for i := 1; i < 1000; i++ {
		ind := strings.Repeat(" ", 2*i)
		b.WriteString(ind + "  - key: *k\n" + ind + "    descriptors:\n")
	}
	path := filepath.Join(t.TempDir(), "deep.yaml")
	os.WriteFile(path, []byte(b.String()), 0o644)
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "validate", path}, &out, &errOut, noEnv); code != 1 ||
		!strings.Contains(errOut.String(), "deeper than") {
		t.Errorf("deep nesting: exit %d, %.300q; want 1 and an error on the depth", code, errOut.String())
	}
}

func TestCheckCommand(t *testing.T) {
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	env := func(k string) string {
		if k == "SLUICE_ADDR" {
			return "http://" + d.HTTPAddr()
		}
		return ""
	}
	args := []string{"check", "--client-id", "dave", "--resource", "/api/v1/demo"}
	var out, errOut bytes.Buffer
	// The demo rule is a fixed window of a minute: the six checks must
	// not straddle the minute's end, or the sixth is allowed.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 15*time.Second {
		time.Sleep(left + 10*time.Millisecond)
	}
	for i := range 5 {
		if code := run(args, &out, &errOut, env); code != 0 {
			t.Fatalf("check %d: exit %d: %s %s", i+1, code, out.String(), errOut.String())
		}
	}
	out.Reset()
	if code := run(args, &out, &errOut, env); code != 1 || !strings.HasPrefix(out.String(), "denied (HTTP 429)") {
		t.Errorf("sixth check: exit %d, %q; want 1 and a denial", code, out.String())
	}
	if code := run([]string{"check", "--addr", "http://127.0.0.1:1", "--client-id", "x", "--timeout", "200ms"}, &out, &errOut, noEnv); code != 3 {
		t.Errorf("no server: exit %d, want 3", code)
	}
}

// sluice version and --version print the build's version and commit.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		var out, errOut bytes.Buffer
		if code := run([]string{arg}, &out, &errOut, noEnv); code != 0 {
			t.Fatalf("sluice %s: exit %d", arg, code)
		}
		if got := out.String(); !strings.HasPrefix(got, "sluice ") || !strings.Contains(got, "commit ") {
			t.Errorf("sluice %s printed %q, want a version and a commit", arg, got)
		}
	}
}

// Asking a command for help succeeds; an unknown flag does not.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"serve", "--help"}, {"serve", "-h"}, {"config", "validate", "--help"},
		{"check", "--help"}, {"load", "--help"}, {"admin", "--help"}, {"admin", "rules", "get", "--help"}, {"-help"}, {"help", "serve"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut, noEnv); code != 0 {
			t.Errorf("sluice %s: exit %d, want 0\n%s", strings.Join(args, " "), code, errOut.String())
		}
		if out.Len()+errOut.Len() == 0 {
			t.Errorf("sluice %s printed no usage", strings.Join(args, " "))
		}
	}
	for _, args := range [][]string{{"serve", "--no-such-flag"}, {"check", "--no-such-flag"}, {"config", "validate", "--no-such-flag"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut, noEnv); code != 2 {
			t.Errorf("sluice %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
}

// serve's usage shows each flag's own default and the environment
// variable that sets it, never the variable's value: SLUICE_STORE may hold
// the store's password.
func TestServeHelpShowsDefaultsNotEnvironment(t *testing.T) {
	env := map[string]string{"SLUICE_STORE": "rediss://user:s3cret@redis.internal:6380", "SLUICE_LOG_LEVEL": "debug"}
	var out, errOut bytes.Buffer
	run([]string{"serve", "-h"}, &out, &errOut, func(k string) string { return env[k] })
	help := errOut.String() + out.String()
	if strings.Contains(help, "s3cret") || strings.Contains(help, "redis.internal") {
		t.Errorf("serve -h prints the environment's store URL:\n%s", help)
	}
	for _, want := range []string{`--store="` + daemon.DefaultStoreURL + `"`, `--log-level="info"`,
		"SLUICE_STORE", "SLUICE_CONFIG", "SLUICE_GC_PERCENT", "SLUICE_SHUTDOWN_TIMEOUT", "SLUICE_STORE_DEADLINE", "SLUICE_REDIS_DIAL_TIMEOUT",
		"SLUICE_GRPC_READ_TIMEOUT", "SLUICE_GRPC_MAX_CONNS", "SLUICE_GRPC_KEEPALIVE",
		"SLUICE_GRPC_MAX_CONNECTION_AGE", "SLUICE_EXIT_ON_UNAVAILABLE_STORE", "SLUICE_SHUTDOWN_DELAY"} {
		if !strings.Contains(help, want) {
			t.Errorf("serve -h does not show %s:\n%s", want, help)
		}
	}
}

// Every flag of serve reads its SLUICE_* environment variable when it is
// not on the command line, and the command line wins.
func TestServeFlagsFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string // in the error
	}{
		// The environment is read before the flags' values are checked,
		// so the bad ratio stops a serve that ignores the variable.
		{[]string{"--trace-sample-ratio=2"}, map[string]string{"SLUICE_GC_PERCENT": "lots"}, "SLUICE_GC_PERCENT"},
		{[]string{"--trace-sample-ratio=2"}, map[string]string{"SLUICE_SHUTDOWN_TIMEOUT": "soon"}, "SLUICE_SHUTDOWN_TIMEOUT"},
		{[]string{"--trace-sample-ratio=2"}, map[string]string{"SLUICE_STORE_DEADLINE": "soon"}, "SLUICE_STORE_DEADLINE"},
		{[]string{"--trace-sample-ratio=2"}, map[string]string{"SLUICE_GRPC_READ_TIMEOUT": "soon"}, "SLUICE_GRPC_READ_TIMEOUT"},
		{[]string{"--trace-sample-ratio=2"}, map[string]string{"SLUICE_GRPC_MAX_CONNS": "many"}, "SLUICE_GRPC_MAX_CONNS"},
		{[]string{"extra"}, nil, "unexpected argument extra"},
		{nil, map[string]string{"SLUICE_LOG_LEVEL": "loud"}, "--log-format/--log-level"},
		{[]string{"--trace-sample-ratio", "2"}, nil, "--trace-sample-ratio 2: want 0 to 1"},
		{nil, map[string]string{"SLUICE_TRACE_SAMPLE_RATIO": "NaN"}, "--trace-sample-ratio NaN"},
		{[]string{"--trace-sample-ratio", "-0.1"}, nil, "--trace-sample-ratio"},
		// Given on the command line, the flags do not read the
		// environment: the next error is the ratio's.
		{[]string{"--gc-percent", "100", "--shutdown-timeout", "1s", "--log-level", "info", "--trace-sample-ratio=2"},
			map[string]string{"SLUICE_GC_PERCENT": "lots", "SLUICE_SHUTDOWN_TIMEOUT": "soon", "SLUICE_LOG_LEVEL": "loud"}, "--trace-sample-ratio 2: want 0 to 1"},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"serve"}, tc.args...), &out, &errOut, func(k string) string { return tc.env[k] })
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("serve %q with %v: exit %d, %q; want 2 and an error with %q", tc.args, tc.env, code, errOut.String(), tc.want)
		}
	}
}

// check refuses what it would otherwise ignore: a word after the flags
// (a resource given without --resource was checked as no resource at
// all) and a timeout of zero or less (taken as the client's 1s).
func TestCheckUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--client-id", "x", "/api/v1/orders"},
		{"--client-id", "x", "--timeout", "0"},
		{"--client-id", "x", "--timeout", "-1s"},
	} {
		var out, errOut bytes.Buffer
		if code := run(append([]string{"check", "--addr", "http://127.0.0.1:1"}, args...), &out, &errOut, noEnv); code != 2 {
			t.Errorf("check %q: exit %d (%s), want 2", args, code, errOut.String())
		}
	}
}

// An address that is no HTTP URL, the empty one among them, is refused
// naming --addr.
func TestCheckRefusesBadAddr(t *testing.T) {
	for _, addr := range []string{"", "127.0.0.1:8080", "ftp://127.0.0.1:1"} {
		var out, errOut bytes.Buffer
		code := run([]string{"check", "--client-id", "x", "--addr", addr}, &out, &errOut, noEnv)
		if code != 2 || !strings.Contains(errOut.String(), "--addr") {
			t.Errorf("check --addr %q: exit %d, %q; want 2 and an error naming --addr", addr, code, errOut.String())
		}
	}
}

// A negative --shutdown-timeout is refused at start (exit 2): it used to
// be found only at the first SIGTERM, which then cut off every check in
// flight at once.
func TestServeRefusesNegativeShutdownTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--shutdown-timeout", "-1s")
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--shutdown-timeout") {
		t.Errorf("serve --shutdown-timeout -1s: %v, %q; want exit 2 and an error naming the flag", err, out)
	}
}

// The TLS files of the control plane's store reach it: refused with an
// etcd:// URL, and a certificate without its key is refused at start.
func TestServeConfigStoreTLSFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config-store", "etcd://127.0.0.1:1", "--config-store-ca", filepath.Join(dir, "ca.pem")}, "use an etcds:// URL"},
		{[]string{"--config-store", "etcds://127.0.0.1:1", "--config-store-ca", filepath.Join(dir, "ca.pem")}, "CA file"},
		{[]string{"--config-store", "etcds://127.0.0.1:1", "--config-store-cert", filepath.Join(dir, "c.pem")}, "its key file"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		args := append([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--data-dir", dir}, tc.args...)
		cmd := exec.CommandContext(ctx, os.Args[0], args...)
		cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(string(out), tc.want) {
			t.Errorf("serve %q: %v, %q; want a failure saying %q", tc.args, err, out, tc.want)
		}
	}
}

// sluice check --target envoy asks Envoy's ShouldRateLimit of the gRPC
// address and exits as the HTTP check does: 0 when OK, 1 when over the
// limit, 2 on bad usage, 3 when nothing answers.
func TestCheckEnvoy(t *testing.T) {
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		ConfigPath: "../../examples/envoy-ratelimit.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	env := func(k string) string {
		if k == "SLUICE_CHECK_GRPC_ADDR" {
			return d.GRPCAddr()
		}
		return ""
	}
	// 5 marketing messages a day per phone number.
	args := []string{"check", "--target", "envoy", "--domain", "edge", "--descriptor", "message_type=marketing,to_number=555"}
	for i := range 5 {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut, env); code != 0 || !strings.HasPrefix(out.String(), "allowed (OK)") ||
			!strings.Contains(out.String(), "message_type=marketing,to_number=555: OK, limit 5 per day") {
			t.Fatalf("check %d: exit %d, %q %q; want 0 and the descriptor's limit", i+1, code, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run(args, &out, &errOut, env); code != 1 || !strings.HasPrefix(out.String(), "denied (OVER_LIMIT)") ||
		!strings.Contains(out.String(), "remaining 0") {
		t.Errorf("sixth check: exit %d, %q; want 1 and OVER_LIMIT", code, out.String())
	}
	out.Reset()
	if code := run(append(args, "--json", "--descriptor", "ldap=x"), &out, &errOut, env); code != 1 ||
		!strings.Contains(out.String(), `"overallCode": "OVER_LIMIT"`) || strings.Count(out.String(), `"code"`) != 2 {
		t.Errorf("--json with two descriptors: exit %d, %s; want 1 and two statuses", code, out.String())
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--target", "envoy", "--descriptor", "a=b"}, 2, "--domain"},
		{[]string{"--target", "envoy", "--domain", "edge"}, 2, "--descriptor"},
		{[]string{"--target", "envoy", "--domain", "edge", "--descriptor", "novalue"}, 2, "want key=value"},
		{[]string{"--target", "smtp"}, 2, "want http or envoy"},
		{[]string{"--target", "envoy", "--domain", "edge", "--descriptor", "a=b", "--grpc-addr", "127.0.0.1:1", "--timeout", "300ms"}, 3, ""},
	} {
		var out, errOut bytes.Buffer
		if code := run(append([]string{"check"}, tc.args...), &out, &errOut, noEnv); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("check %q: exit %d, %q; want %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

// check --token (SLUICE_TOKEN) reaches a server that requires a token on
// its check APIs, HTTP and Envoy's; without it the server refuses.
func TestCheckToken(t *testing.T) {
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		DataDir: t.TempDir(), AdminToken: "t0ken-for-the-test", RequireCheckToken: true,
		ConfigPath: "../../examples/envoy-ratelimit.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	for _, args := range [][]string{
		{"check", "--addr", "http://" + d.HTTPAddr(), "--client-id", "x", "--resource", "/r"},
		{"check", "--target", "envoy", "--grpc-addr", d.GRPCAddr(), "--domain", "edge", "--descriptor", "remote_address=10.0.0.1"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut, noEnv); code == 0 {
			t.Errorf("%q without a token: exit 0, %q; want a refusal", args, out.String())
		}
		out.Reset()
		errOut.Reset()
		withToken := func(k string) string {
			if k == "SLUICE_TOKEN" {
				return "t0ken-for-the-test"
			}
			return ""
		}
		if code := run(args, &out, &errOut, withToken); code != 0 {
			t.Errorf("%q with SLUICE_TOKEN: exit %d, %q %q; want 0", args, code, out.String(), errOut.String())
		}
	}
}
