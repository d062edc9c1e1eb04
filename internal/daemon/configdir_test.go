package daemon_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/policy"
)

func envoyDomainText(domain string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: " +
		strconv.Itoa(rpu) + "\n"
}

// envoyRPU returns the requests per unit of domain's limit for a user, -1
// for none.
func (td *testDaemon) envoyRPU(domain string) int64 {
	l := td.Engine().Policy().EnvoyLimit(domain, []policy.DescriptorEntry{{Key: "user", Value: "u"}})
	if l == nil {
		return -1
	}
	return l.RequestsPerUnit
}

func TestReloadOfConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", envoyDomainText("alpha", 1))
	td := start(t, "", func(c *daemon.Config) { c.ConfigPath = dir; c.WatchDebounce = 20 * time.Millisecond })
	if got := td.envoyRPU("alpha"); got != 1 {
		t.Fatalf("alpha: got %d, want 1", got)
	}
	write("b.yaml", envoyDomainText("beta", 2))
	if _, ok := waitFor(3*time.Second, func() bool { return td.envoyRPU("beta") == 2 }); !ok {
		t.Fatalf("a file added to the directory: beta is %d, want 2", td.envoyRPU("beta"))
	}
	write("a.yaml", envoyDomainText("alpha", 5))
	if _, ok := waitFor(3*time.Second, func() bool { return td.envoyRPU("alpha") == 5 }); !ok {
		t.Fatalf("a file of the directory changed: alpha is %d, want 5", td.envoyRPU("alpha"))
	}
	// A second file of domain alpha, without merging: rejected, the
	// configuration in force stays.
	write("c.yaml", envoyDomainText("alpha", 9))
	if _, ok := waitFor(3*time.Second, func() bool {
		return strings.Contains(td.ConfigStatus().LastError, "duplicate domain")
	}); !ok {
		t.Fatalf("a repeated domain: status error %q, want a duplicate domain", td.ConfigStatus().LastError)
	}
	if got := td.envoyRPU("alpha"); got != 5 {
		t.Errorf("after a rejected directory: alpha is %d, want 5", got)
	}
}

func TestReloadOfMergedDomains(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "1.yaml"), []byte(envoyDomainText("alpha", 1)), 0o644)
	os.WriteFile(filepath.Join(dir, "2.yaml"), []byte("domain: alpha\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 4}\n"), 0o644)
	td := start(t, "", func(c *daemon.Config) { c.ConfigPath = dir; c.MergeDomains = true })
	if got := td.envoyRPU("alpha"); got != 1 {
		t.Errorf("alpha user: got %d, want 1", got)
	}
	if l := td.Engine().Policy().EnvoyLimit("alpha", []policy.DescriptorEntry{{Key: "ip", Value: "i"}}); l == nil || l.RequestsPerUnit != 4 {
		t.Errorf("alpha ip: got %+v, want 4 per second", l)
	}
}

// TestReloadOfNonRegularFiles replaces the configuration by a named pipe,
// then by a symlink to /dev/zero: each reload fails at once, the
// configuration in force stays, and the daemon still shuts down.
func TestReloadOfNonRegularFiles(t *testing.T) {
	td := start(t, envoyDomainText("alpha", 3), func(c *daemon.Config) { c.WatchDebounce = 20 * time.Millisecond })
	if err := os.Remove(td.path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(td.path, 0o644); err != nil {
		t.Fatal(err)
	}
	reloadWithin := func(what string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- td.Reload() }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("reload of %s: got %v, want not a regular file", what, err)
			}
		case <-time.After(2 * policy.ReadTimeout):
			t.Fatalf("reload of %s did not return", what)
		}
		if got := td.envoyRPU("alpha"); got != 3 {
			t.Errorf("after reading %s: alpha is %d, want 3", what, got)
		}
	}
	reloadWithin("a named pipe")
	os.Remove(td.path)
	if err := os.Symlink("/dev/zero", td.path); err != nil {
		t.Fatal(err)
	}
	reloadWithin("a symlink to /dev/zero")
}

// TestReloadAfterChmod checks that a file made readable again is read:
// its change of mode is an event of the watch.
func TestReloadAfterChmod(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads a file whatever its mode")
	}
	td := start(t, envoyDomainText("alpha", 3), func(c *daemon.Config) { c.WatchDebounce = 20 * time.Millisecond })
	if err := os.Chmod(td.path, 0); err != nil {
		t.Fatal(err)
	}
	// Fixed while unreadable: the reload this write makes cannot read it.
	f, err := os.OpenFile(td.path, os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		f.Close()
	}
	os.Chmod(td.path, 0o200)
	os.WriteFile(td.path, []byte(envoyDomainText("alpha", 6)), 0o200)
	if _, ok := waitFor(3*time.Second, func() bool { return td.ConfigStatus().LastError != "" }); !ok {
		t.Fatalf("a write to an unreadable file: no reload error")
	}
	if err := os.Chmod(td.path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := waitFor(3*time.Second, func() bool { return td.envoyRPU("alpha") == 6 }); !ok {
		t.Fatalf("after chmod back: alpha is %d, want 6", td.envoyRPU("alpha"))
	}
}

// TestRejectionErrorIsCut checks that the error of a rejected file with a
// long value quotes only its start.
func TestRejectionErrorIsCut(t *testing.T) {
	td := start(t, envoyDomainText("alpha", 3))
	long := strings.Repeat("v", 1200<<10)
	bad := "domain: alpha\ndescriptors:\n  - key: user\n    rate_limit: " + long + "\n"
	if err := os.WriteFile(td.path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	err := td.Reload()
	if err == nil {
		t.Fatal("Reload of a bad file: no error")
	}
	if n := len(td.ConfigStatus().LastError); n > 8<<10 {
		t.Errorf("status error of %d bytes for a file of %d, want at most 8 KiB", n, len(bad))
	}
}
