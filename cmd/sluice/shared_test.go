package main

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestMain lets the test binary stand in for the sluice command: with
// SLUICE_TEST_MAIN set it runs the command line it was given and exits, so
// tests can start real `sluice serve` processes without building the binary.
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
	}
	os.Exit(m.Run())
}

var listening = regexp.MustCompile(`msg="sluice listening" http=(\S+)`)

// serveProcess starts `sluice serve args...` as a process of its own and
// returns it with its HTTP address, read from its log.
func serveProcess(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case a := <-addr:
		return cmd, a
	case <-time.After(30 * time.Second):
		t.Fatal("sluice serve did not start listening")
	}
	return nil, ""
}

// TestTwoProcessesShareRedis runs two `sluice serve` processes on one Redis
// with a rule of 100 per minute for one client: 1000 concurrent checks
// spread over both admit exactly 100.
func TestTwoProcessesShareRedis(t *testing.T) {
	srv := redistest.Start(t)
	config := filepath.Join(t.TempDir(), "sluice.yaml")
	// The sliding window log keeps every admission for a whole minute, so
	// the count is exact however the test straddles the wall clock's
	// minutes.
	os.WriteFile(config, []byte(`version: 1
rules:
  - id: shared
    match: { resource: /api/shared }
    dimension: client
    algorithm: sliding_window_log
    limit: 100
    window: 1m
`), 0o644)
	// A generous store deadline: this test is about exact counts, and under
	// -race on a busy machine a Redis call can take longer than the
	// default, which would apply the rule's failure mode (fail_open).
	args := []string{"--config", config, "--store", "redis://" + srv.Addr, "--store-deadline", "2s", "--log-level", "info"}
	p1, a1 := serveProcess(t, args...)
	p2, a2 := serveProcess(t, args...)

	tr := &http.Transport{MaxConnsPerHost: 64, MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	body := []byte(`{"client_id":"acme","resource":"/api/shared"}`)
	for i := range 1000 {
		addr := a1
		if i%2 == 1 {
			addr = a2
		}
		wg.Go(func() {
			resp, err := c.Post("http://"+addr+"/api/v1/check", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				allowed.Add(1)
			case http.StatusTooManyRequests:
				denied.Add(1)
			default:
				t.Errorf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 100 || denied.Load() != 900 {
		t.Errorf("two processes admitted %d and denied %d of 1000, want exactly 100 and 900", allowed.Load(), denied.Load())
	}

	// SIGTERM: both stop accepting, finish what is in flight and exit 0.
	for _, p := range []*exec.Cmd{p1, p2} {
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sluice serve after SIGTERM: %v, want exit 0", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("sluice serve (pid %d) still running 20s after SIGTERM", p.Process.Pid)
		}
	}
}

// TestServeRedisTLS runs `sluice serve` on a Redis that speaks TLS with a
// certificate of a private CA and requires client certificates: given the
// CA, the client certificate and its key by flags, the process's checks
// are decided by the store; without the CA, serve does not start, and its
// error names the flag that gives one.
func TestServeRedisTLS(t *testing.T) {
	pki := redistest.NewPKI(t)
	srv := redistest.StartTLS(t, &redistest.TLSOptions{PKI: pki, AuthClients: true})
	var out, errOut bytes.Buffer
	// A long dial timeout: on a busy machine, under -race, a TLS
	// handshake can outlast the default 1s, and the error would be the
	// timeout's.
	code := run([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--gc-percent", "0",
		"--store", "rediss://" + srv.TLSAddr, "--redis-dial-timeout", "10s"}, &out, &errOut, noEnv)
	if msg := errOut.String(); code != 1 || !strings.Contains(msg, "unknown authority") || !strings.Contains(msg, "--redis-tls-ca-file") {
		t.Errorf("serve without the CA: exit %d, %q; want 1 and an error naming --redis-tls-ca-file", code, msg)
	}
	_, addr := serveProcess(t, "--store", "rediss://"+srv.TLSAddr, "--store-deadline", "2s", "--redis-dial-timeout", "10s",
		"--redis-tls-ca-file", pki.CAFile, "--redis-tls-cert-file", pki.ClientCertFile, "--redis-tls-key-file", pki.ClientKeyFile,
		"--redis-tls-server-name", pki.ServerName)
	resp, err := http.Post("http://"+addr+"/api/v1/check", "application/json", strings.NewReader(`{"client_id":"tls","resource":"/api/v1/demo"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if src := resp.Header.Get("X-RateLimit-Decision-Source"); resp.StatusCode != http.StatusOK || src != "store" {
		t.Errorf("check: %d, decision source %q; want 200 decided by the store", resp.StatusCode, src)
	}
	if keys, err := srv.Do("KEYS", "*tls*"); err != nil || keys == "" {
		t.Errorf("the server holds no key of the check: %q, %v", keys, err)
	}
}

// TestServeRedisTLSErrors: a Redis TLS flag given for a store without
// TLS, or naming a file that cannot be used, stops serve with an error
// that names the flag (and the file), whether the flag was given on the
// command line or by its environment variable, and never shows the key.
// error names that flag.
func TestServeRedisTLSErrors(t *testing.T) {
	pki := redistest.NewPKI(t)
	key, err := os.ReadFile(pki.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	keyLine := strings.Split(string(key), "\n")[1]
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"--redis-tls-ca-file", pki.CAFile}, nil, []string{"--redis-tls-ca-file", "memory://"}},
		{[]string{"--store", "redis://127.0.0.1:1"}, map[string]string{"SLUICE_REDIS_TLS_SERVER_NAME": "r"}, []string{"--redis-tls-server-name", "redis://"}},
		{[]string{"--store", "rediss://127.0.0.1:1"}, map[string]string{"SLUICE_REDIS_TLS_CA_FILE": pki.ClientKeyFile}, []string{"--redis-tls-ca-file", pki.ClientKeyFile, "no PEM certificate"}},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-ca-file", missing}, nil, []string{"--redis-tls-ca-file", missing, "no such file"}},
		{[]string{"--store", "rediss://127.0.0.1:1", "--redis-tls-cert-file", pki.ClientCertFile}, nil, []string{"--redis-tls-key-file", "needs its key"}},
		{[]string{"--store", "rediss-cluster://127.0.0.1:1", "--redis-tls-cert-file", pki.ClientCertFile, "--redis-tls-key-file", pki.ServerKeyFile}, nil,
			[]string{"--redis-tls-key-file", pki.ServerKeyFile, pki.ClientCertFile, "does not match"}},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--gc-percent", "0"}, tc.args...),
			&out, &errOut, func(k string) string { return tc.env[k] })
		msg := errOut.String()
		if code != 1 {
			t.Errorf("serve %q with %v: exit %d, want 1: %s", tc.args, tc.env, code, msg)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("serve %q with %v: %q, want %q in it", tc.args, tc.env, msg, w)
			}
		}
		if strings.Contains(msg, keyLine) || strings.Contains(msg, "PRIVATE KEY") {
			t.Errorf("serve %q: %q shows the key", tc.args, msg)
		}
	}
}
