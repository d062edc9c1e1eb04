package main

import (
	"bytes"
	"context"
	"os"
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
