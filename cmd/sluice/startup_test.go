package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestServeWithRedisDown starts `sluice serve` on a Redis that is not
// running yet: it serves, /readyz answers 503, and checks follow their
// rules' failure modes; once Redis runs, /readyz answers 200 within 2s and
// a limit of 5 admits exactly 5. SIGTERM then stops it with exit 0.
func TestServeWithRedisDown(t *testing.T) {
	srv := redistest.Start(t) // for its free port
	srv.Kill()
	config := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(config, []byte(`version: 1
rules:
  - { id: open,   match: { resource: /open },   dimension: client, limit: 5, window: 1m, failure_mode: fail_open }
  - { id: closed, match: { resource: /closed }, dimension: client, limit: 5, window: 1m, failure_mode: fail_closed }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	p, addr := serveProcess(t, "--config", config, "--store", "redis://"+srv.Addr, "--store-deadline", "2s")
	c := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("X-RateLimit-Decision-Source")
	}
	check := func(client, resource string) (int, string) {
		return do("POST", "/api/v1/check", `{"client_id":"`+client+`","resource":"`+resource+`"}`)
	}
	if st, _ := do("GET", "/readyz", ""); st != 503 {
		t.Errorf("readyz with Redis down: %d, want 503", st)
	}
	if st, _ := do("GET", "/healthz", ""); st != 200 {
		t.Errorf("healthz with Redis down: %d, want 200", st)
	}
	if st, src := check("a", "/open"); st != 200 || src != "fail_open" {
		t.Errorf("fail_open check with Redis down: %d from %s", st, src)
	}
	if st, src := check("a", "/closed"); st != 503 || src != "fail_closed" {
		t.Errorf("fail_closed check with Redis down: %d from %s", st, src)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	for {
		if st, _ := do("GET", "/readyz", ""); st == 200 {
			break
		}
		if time.Since(up) > 2*time.Second {
			t.Fatalf("readyz not 200 2s after Redis started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("ready %s after Redis started", time.Since(up).Round(time.Millisecond))
	admitted := 0
	for range 10 {
		st, src := check("b", "/closed")
		if st == 200 {
			admitted++
		}
		if st != 200 && st != 429 {
			t.Errorf("check with Redis up: %d from %s", st, src)
		}
	}
	if admitted != 5 {
		t.Errorf("a limit of 5 with Redis up admitted %d", admitted)
	}

	p.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("sluice serve after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("sluice serve still running 20s after SIGTERM")
	}
}

// TestServeExitOnUnavailableStore: with --exit-on-unavailable-store (or
// its variable), serve exits 1 when Redis does not answer.
func TestServeExitOnUnavailableStore(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--exit-on-unavailable-store"}, nil},
		{nil, map[string]string{"SLUICE_EXIT_ON_UNAVAILABLE_STORE": "true"}},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--gc-percent", "0",
			"--store", "redis://" + srv.Addr}, tc.args...)
		code := run(args, &out, &errOut, func(k string) string { return tc.env[k] })
		if code != 1 || !strings.Contains(errOut.String(), "store unavailable") {
			t.Errorf("serve %q with %v: exit %d, %q; want 1 and the store unavailable", tc.args, tc.env, code, errOut.String())
		}
	}
}
