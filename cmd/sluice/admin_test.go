package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/adminapi"
	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/filestore"
)

// adminServer starts the admin API over a real Plane on a file store, with
// one admin token "root-secret".
func adminServer(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-admin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := filestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := control.Open(context.Background(), control.Options{Backend: s, Instance: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	h, err := adminapi.New(adminapi.Config{Plane: p, Tokens: []control.Token{{Name: "root", Role: control.RoleAdmin, SHA256: auth.Hash("root-secret")}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func runAdmin(t *testing.T, stdin string, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	inv := &invocation{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] }}
	code := inv.run(append([]string{"admin"}, args...))
	return code, out.String(), errb.String()
}

func TestAdminCLI(t *testing.T) {
	addr := adminServer(t)
	env := map[string]string{"SLUICE_ADDR": addr, "SLUICE_TOKEN": "root-secret"}
	rule := filepath.Join(t.TempDir(), "rule.yaml")
	os.WriteFile(rule, []byte("id: api\nmatch: {resource: /api/*}\ndimension: client\nalgorithm: token_bucket\nlimit: 100\nwindow: 1m\n"), 0o600)
	for _, tc := range []struct {
		args     []string
		wantCode int
		want     string // in stdout, or stderr when the code is not 0
	}{
		{[]string{"rules", "put", "-f", rule, "--reason", "new"}, 0, `"version": 1`},
		{[]string{"rules", "list"}, 0, `"id": "api"`},
		{[]string{"rules", "get", "api"}, 0, `"limit": 100`},
		{[]string{"rules", "put", "-f", rule, "--version", "7"}, 1, `"current_version": 1`},
		{[]string{"tier", "set", "user", "alice", "gold", "--reason", "upgrade"}, 0, `"tier": "gold"`},
		{[]string{"override", "add", "user", "alice", "--rule", "api", "--limit", "500", "--duration", "1h", "--reason", "launch"}, 0, `"limit": 500`},
		{[]string{"override", "add", "user", "alice", "--rule", "api", "--limit", "500", "--duration", "1h"}, 1, `"field": "reason"`},
		{[]string{"limits", "user", "alice"}, 0, `"tier": "gold"`},
		{[]string{"throttle", "--scope", "global", "--percent", "50", "--duration", "10m", "--reason", "incident"}, 0, `"status": "applied"`},
		{[]string{"throttle", "list"}, 0, `"reduction_percent": 50`},
		{[]string{"audit", "--object", "rule"}, 0, `"actor"`},
		{[]string{"token", "new", "ci", "--role", "viewer"}, 0, `"token": "slc_`},
		{[]string{"token", "list"}, 0, `"name": "ci"`},
		{[]string{"rules", "delete", "api"}, 0, `"deleted"`},
		{[]string{"rules", "get", "api"}, 1, `"not_found"`},
		{[]string{"tier", "set", "robot", "r2", "gold"}, 2, "want user, client or api_key"},
		{[]string{"rules", "--help"}, 0, ""},
		{[]string{"--help"}, 0, "Usage: sluice admin"},
	} {
		code, out, errOut := runAdmin(t, "", env, tc.args...)
		got := out
		if tc.wantCode != 0 {
			got = errOut
		}
		if code != tc.wantCode || !strings.Contains(got, tc.want) {
			t.Errorf("sluice admin %q: exit %d\nstdout: %s\nstderr: %s\nwant exit %d and %q", tc.args, code, out, errOut, tc.wantCode, tc.want)
		}
	}
	// Without a token: 401 and the server's JSON error.
	code, _, errOut := runAdmin(t, "", map[string]string{"SLUICE_ADDR": addr}, "rules", "list")
	if code != 1 || !strings.Contains(errOut, `"unauthorized"`) {
		t.Errorf("no token: exit %d, %s", code, errOut)
	}
}

func TestAdminTokenHash(t *testing.T) {
	code, out, _ := runAdmin(t, "slc_secret\n", nil, "token", "hash", "--name", "ci", "--role", "operator")
	want := "- {name: ci, role: operator, sha256: " + auth.Hash("slc_secret") + "}\n"
	if code != 0 || out != want {
		t.Fatalf("token hash: exit %d, %q; want %q", code, out, want)
	}
	if _, err := auth.ParseTokens([]byte(out)); err != nil {
		t.Fatalf("the printed line is not a valid tokens file: %v", err)
	}
	if code, _, _ := runAdmin(t, "", nil, "token", "hash"); code != 2 {
		t.Fatalf("token hash with no input: exit %d; want 2", code)
	}
}
