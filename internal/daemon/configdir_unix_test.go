//go:build unix

package daemon_test

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/policy"
)

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
