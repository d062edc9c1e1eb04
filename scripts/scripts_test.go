// Package scripts_test runs the shell scripts of scripts/ on a PATH of
// stubs, so that what they do on a machine without Redis is tested
// without installing anything.
package scripts_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// stubs makes a directory of executable scripts named by the keys of cmds,
// each with its value as body, plus links to the real tools the scripts
// under test need, and returns it.
func stubs(t *testing.T, cmds map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range cmds {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tool := range []string{"cat", "grep", "sleep"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s not found: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(dir, tool)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// run runs script with bash on PATH dir and returns its exit code and
// standard error.
func run(t *testing.T, script, dir string) (int, string) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the scripts are for Unix")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skipf("bash not found: %v", err)
	}
	cmd := exec.Command(bash, script)
	cmd.Env = []string{"PATH=" + dir}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("%s: %v", script, err)
	return 0, ""
}

func TestEnsureRedis(t *testing.T) {
	const root = "echo 0"
	tests := []struct {
		name     string
		cmds     map[string]string
		wantCode int
		want     []string // in standard error
	}{
		{
			name:     "installed",
			cmds:     map[string]string{"redis-server": "", "redis-cli": ""},
			wantCode: 0,
		},
		{
			name:     "no apt-get",
			cmds:     map[string]string{"id": root},
			wantCode: 1,
			want:     []string{"Could not install redis-server", "brew install redis"},
		},
		{
			// apt-get cannot install (no network, no such package): the
			// script still says what to install.
			name: "apt-get install fails",
			cmds: map[string]string{"id": root,
				"apt-get": `case "$*" in *install*) echo "E: Unable to locate package redis-server" >&2; exit 100;; esac`},
			wantCode: 1,
			want:     []string{"Unable to locate package", "Could not install redis-server", "apt-get install redis-server"},
		},
		{
			name: "apt-get update fails",
			cmds: map[string]string{"id": root,
				"apt-get": `case "$*" in *update*) echo "E: network unreachable" >&2; exit 100;; esac`},
			wantCode: 1,
			want:     []string{"Could not install redis-server"},
		},
		{
			// The tests need redis-cli too (to create clusters).
			name:     "redis-cli missing",
			cmds:     map[string]string{"id": root, "redis-server": ""},
			wantCode: 1,
			want:     []string{"redis-cli not found", "Could not install redis-server"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stderr := run(t, "ensure-redis.sh", stubs(t, tt.cmds))
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tt.wantCode, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
		})
	}
}

func TestEnsureChromium(t *testing.T) {
	const root = "echo 0"
	// apt-get "installs" chromium by writing a stub beside itself.
	const aptInstalls = `case "$*" in *install*) printf '#!/bin/sh\n' > "$(dirname "$0")/chromium"; chmod +x "$(dirname "$0")/chromium";; esac`
	tests := []struct {
		name     string
		cmds     map[string]string
		wantCode int
		want     []string // in standard error
	}{
		{name: "installed", cmds: map[string]string{"chromium": ""}, wantCode: 0},
		{name: "google-chrome instead", cmds: map[string]string{"google-chrome": ""}, wantCode: 0},
		{
			name:     "installed by apt-get",
			cmds:     map[string]string{"id": root, "apt-get": aptInstalls},
			wantCode: 0,
			want:     []string{"installing chromium with apt-get"},
		},
		{
			name:     "no apt-get",
			cmds:     map[string]string{"id": root},
			wantCode: 1,
			want:     []string{"Could not install Chromium", "apt-get install chromium"},
		},
		{
			name: "apt-get install fails",
			cmds: map[string]string{"id": root,
				"apt-get": `case "$*" in *install*) echo "E: Unable to locate package chromium" >&2; exit 100;; esac`},
			wantCode: 1,
			want:     []string{"Unable to locate package", "Could not install Chromium"},
		},
		{
			name:     "not root, no sudo",
			cmds:     map[string]string{"id": "echo 1000", "apt-get": aptInstalls},
			wantCode: 1,
			want:     []string{"Could not install Chromium"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := stubs(t, tt.cmds)
			for _, tool := range []string{"dirname", "chmod", "printf"} {
				if p, err := exec.LookPath(tool); err == nil {
					os.Symlink(p, filepath.Join(dir, tool))
				}
			}
			code, stderr := run(t, "ensure-chromium.sh", dir)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tt.wantCode, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// TestMakeTestWithoutCgo checks that `make test` runs where Go has no C
// compiler (cgo off), which the race detector needs: without it the tests
// run without -race, and it says so, instead of failing to build.
func TestMakeTestWithoutCgo(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the Makefile is for Unix")
	}
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skipf("make not found: %v", err)
	}
	for _, cgo := range []string{"0", "1"} {
		cmd := exec.Command(mk, "-n", "test")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("CGO_ENABLED=%s make -n test: %v\n%s", cgo, err, out)
		}
		var race, said bool
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "go test") && strings.Contains(line, "-race") {
				race = true
			}
			if strings.Contains(line, "without the race detector") {
				said = true
			}
		}
		if want := cgo == "1"; race != want || said == want {
			t.Errorf("CGO_ENABLED=%s: go test with -race %v, says it runs without %v; want %v, %v:\n%s", cgo, race, said, want, !want, out)
		}
	}
}

func TestEnsurePromtool(t *testing.T) {
	// apt-cache policy goes on writing after the candidate line, as the
	// real one does (the version table), after grep has what it needs.
	const policy = `echo "prometheus:"; echo "  Installed: (none)"; echo "  Candidate: 2.42.0+ds-5"; sleep 0.2; i=0; while [ $i -lt 2000 ]; do echo "     2.42.0+ds-5 500"; i=$((i+1)); done`
	tests := []struct {
		name    string
		cmds    map[string]string
		install bool // promtool is installed
		want    string
	}{
		{
			name:    "candidate",
			cmds:    map[string]string{"id": "echo 0", "apt-cache": policy, "apt-get": `touch "$(dirname "$0")/promtool.installed"`},
			install: true,
			want:    "installing promtool",
		},
		{
			name: "no candidate",
			cmds: map[string]string{"id": "echo 0", "apt-cache": `echo "prometheus:"; echo "  Candidate: (none)"`,
				"apt-get": `touch "$(dirname "$0")/promtool.installed"`},
			want: "checked by the Go test only",
		},
		{
			name: "no apt-get",
			cmds: map[string]string{"id": "echo 0"},
			want: "checked by the Go test only",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := stubs(t, tt.cmds)
			if p, err := exec.LookPath("touch"); err == nil {
				os.Symlink(p, filepath.Join(dir, "touch"))
			}
			if p, err := exec.LookPath("dirname"); err == nil {
				os.Symlink(p, filepath.Join(dir, "dirname"))
			}
			code, stderr := run(t, "ensure-promtool.sh", dir)
			if code != 0 {
				t.Errorf("exit code %d, want 0 (it never fails); stderr:\n%s", code, stderr)
			}
			_, err := os.Stat(filepath.Join(dir, "promtool.installed"))
			if got := err == nil; got != tt.install {
				t.Errorf("apt-get install called: %v, want %v; stderr:\n%s", got, tt.install, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr does not say %q:\n%s", tt.want, stderr)
			}
		})
	}
}

// TestRunScriptsParse checks the syntax of the scripts that run servers
// (bash -n), which only a long run would otherwise exercise.
func TestRunScriptsParse(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skipf("bash not found: %v", err)
	}
	for _, s := range []string{"control-plane-runs.sh", "load-runs.sh", "redis-cpu-runs.sh"} {
		if out, err := exec.Command(bash, "-n", s).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", s, err, out)
		}
	}
}

// TestControlPlaneRunsHelp checks that control-plane-runs.sh explains
// itself with --help, builds and starts nothing then, and refuses other
// arguments.
func TestControlPlaneRunsHelp(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the scripts are for Unix")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skipf("bash not found: %v", err)
	}
	for _, tt := range []struct {
		arg      string
		wantCode int
		want     string
	}{
		{"--help", 0, "Environment: RULES (10000)"},
		{"--rounds", 2, "usage:"},
	} {
		// An empty PATH: go, python3 and the servers are not reached.
		cmd := exec.Command(bash, "control-plane-runs.sh", tt.arg)
		cmd.Env = []string{"PATH=" + t.TempDir()}
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tt.wantCode || !strings.Contains(string(out), tt.want) {
			t.Errorf("%s: exit code %d, want %d, output should say %q:\n%s", tt.arg, code, tt.wantCode, tt.want, out)
		}
		if strings.HasPrefix(string(out), "#") {
			t.Errorf("%s: the help keeps its comment marks:\n%s", tt.arg, out)
		}
	}
}
