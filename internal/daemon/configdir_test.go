package daemon_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
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

// TestReloadOfDeepNesting checks that a small file of 1,000 nested
// descriptors, each keyed by a 64 KiB anchored key, is rejected on
// reload, in bounded memory, and the configuration in force stays.
func TestReloadOfDeepNesting(t *testing.T) {
	td := start(t, envoyDomainText("alpha", 3))
	var b strings.Builder
	b.WriteString("domain: alpha\ndescriptors:\n  - key: &k " + strings.Repeat("k", 64<<10) + "\n    descriptors:\n")
	for i := 1; i < 1000; i++ {
		ind := strings.Repeat(" ", 2*i)
		b.WriteString(ind + "  - key: *k\n" + ind + "    descriptors:\n")
	}
	if err := os.WriteFile(td.path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := td.Reload()
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "deeper than") {
		t.Errorf("Reload: got %.300v, want an error on the depth", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
		t.Errorf("Reload allocated %d MiB, want at most 256", alloc>>20)
	}
	if got := td.envoyRPU("alpha"); got != 3 {
		t.Errorf("after the rejected reload: alpha is %d, want 3", got)
	}
}
