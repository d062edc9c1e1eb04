package daemon_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/events"
)

// sinkFunc is an events.Sink calling a function.
type sinkFunc func(*events.Event)

func (f sinkFunc) Emit(ev *events.Event) { f(ev) }

// limitOf returns the limit of rule per-client for client r1, without
// consuming anything.
func (td *testDaemon) limitOf(t *testing.T) int64 {
	t.Helper()
	return td.check(t, `{"client_id":"r1","resource":"/api/limited","cost":0}`).num("limit")
}

// withLimit returns the test policy with rule per-client's limit set to n.
func withLimit(n int) string {
	return strings.Replace(policyText(), "limit: 3\n", "limit: "+strconv.Itoa(n)+"\n", 1)
}

// A change of the file while the daemon starts, after it read the file
// and before it serves, is applied once it serves: Kubernetes may update
// a ConfigMap's volume at any moment of a pod's start.
func TestReloadOfChangeMadeDuringStart(t *testing.T) {
	var once sync.Once
	var path string
	td := start(t, policyText(), func(c *daemon.Config) {
		c.WatchDebounce = 20 * time.Millisecond
		path = c.ConfigPath
		// The policy read at start is applied before the daemon
		// serves: the file changes then.
		c.EventSinks = append(c.EventSinks, sinkFunc(func(ev *events.Event) {
			if ev.Type == events.ConfigUpdated {
				once.Do(func() {
					if err := os.WriteFile(path, []byte(withLimit(7)), 0o644); err != nil {
						t.Error(err)
					}
				})
			}
		}))
	})
	if took, ok := waitFor(3*time.Second, func() bool { return td.limitOf(t) == 7 }); !ok {
		t.Fatalf("the file changed during start, but %s after start the limit is %d, want 7", took, td.limitOf(t))
	}
}

// A change of the file is applied even while another file in its
// directory keeps changing (a log, a lock file): the watcher waits for
// changes in the directory to settle, but not forever.
func TestReloadWhileTheDirectoryKeepsChanging(t *testing.T) {
	td := start(t, policyText(), func(c *daemon.Config) { c.WatchDebounce = 100 * time.Millisecond })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		other := filepath.Join(filepath.Dir(td.path), "other.log")
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			f, err := os.OpenFile(other, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			f.WriteString("busy\n")
			f.Close()
		}
	})
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(100 * time.Millisecond)
	if err := os.WriteFile(td.path, []byte(withLimit(7)), 0o644); err != nil {
		t.Fatal(err)
	}
	if took, ok := waitFor(5*time.Second, func() bool { return td.limitOf(t) == 7 }); !ok {
		t.Fatalf("the file changed, but %s later, with another file of its directory written every 10ms, the limit is %d, want 7", took, td.limitOf(t))
	}
}

// A file written in place in two pieces, with a pause between them longer
// than the debounce (a slow writer, a busy machine), is read half-written:
// the half is rejected and the policy in force stays, and the write of the
// rest applies the whole file.
func TestReloadOfHalfWrittenFile(t *testing.T) {
	td := start(t, policyText(), func(c *daemon.Config) { c.WatchDebounce = 20 * time.Millisecond })
	text := withLimit(7)
	// Cut inside a flow mapping, which leaves the first half invalid.
	cut := strings.Index(text, "{ resource: /api/limited }") + len("{ reso")
	f, err := os.OpenFile(td.path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text[:cut]); err != nil {
		t.Fatal(err)
	}
	if _, ok := waitFor(3*time.Second, func() bool { return td.ConfigStatus().LastError != "" }); !ok {
		t.Fatal("the half-written file was never rejected")
	}
	if got := td.limitOf(t); got != 3 {
		t.Errorf("limit with the file half-written = %d, want 3 (the policy in force stays)", got)
	}
	if _, err := f.WriteString(text[cut:]); err != nil {
		t.Fatal(err)
	}
	if took, ok := waitFor(3*time.Second, func() bool { return td.limitOf(t) == 7 }); !ok {
		t.Fatalf("the rest of the file was written, but %s later the limit is %d, want 7", took, td.limitOf(t))
	}
	if st := td.ConfigStatus(); st.LastError != "" {
		t.Errorf("config status after the whole file still shows an error: %q", st.LastError)
	}
}

// swapLink points the symlink link at target as ln -sfn and Kubernetes'
// atomic writer do: a new link renamed over the old one.
func swapLink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A configuration given as a symlink to a file in another directory is
// reloaded when that file changes, and when the link is swapped to
// another file, on the changes of the new one.
func TestReloadOfSymlinkTargetInAnotherDirectory(t *testing.T) {
	linkDir, dir1, dir2 := t.TempDir(), t.TempDir(), t.TempDir()
	link := filepath.Join(linkDir, "sluice.yaml")
	first, second := filepath.Join(dir1, "sluice.yaml"), filepath.Join(dir2, "sluice.yaml")
	writeFile(t, first, policyText())
	writeFile(t, second, withLimit(9))
	if err := os.Symlink(first, link); err != nil {
		t.Fatal(err)
	}
	td := start(t, "", func(c *daemon.Config) {
		c.ConfigPath = link
		c.WatchDebounce = 20 * time.Millisecond
	})
	steps := []struct {
		what  string
		do    func()
		limit int64
	}{
		{"the target written in place", func() { writeFile(t, first, withLimit(7)) }, 7},
		{"the link swapped to a file in a third directory", func() { swapLink(t, second, link) }, 9},
		{"the new target written in place", func() { writeFile(t, second, withLimit(11)) }, 11},
		{"the new target replaced by rename", func() {
			writeFile(t, second+".new", withLimit(12))
			if err := os.Rename(second+".new", second); err != nil {
				t.Fatal(err)
			}
		}, 12},
	}
	for _, s := range steps {
		s.do()
		if took, ok := waitFor(3*time.Second, func() bool { return td.limitOf(t) == s.limit }); !ok {
			t.Fatalf("%s: %s later the limit is %d, want %d", s.what, took, td.limitOf(t), s.limit)
		}
	}
}

// A ConfigMap volume, as Kubernetes updates it: the file is a symlink
// through ..data, a symlink to a timestamped directory that an update
// replaces by renaming a new ..data over it.
func TestReloadOfConfigMapUpdate(t *testing.T) {
	vol := t.TempDir()
	version := func(name, text string) {
		if err := os.Mkdir(filepath.Join(vol, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(vol, name, "sluice.yaml"), text)
	}
	version("..2026_01_01_00_00_00.1", policyText())
	swapLink(t, "..2026_01_01_00_00_00.1", filepath.Join(vol, "..data"))
	if err := os.Symlink("..data/sluice.yaml", filepath.Join(vol, "sluice.yaml")); err != nil {
		t.Fatal(err)
	}
	td := start(t, "", func(c *daemon.Config) {
		c.ConfigPath = filepath.Join(vol, "sluice.yaml")
		c.WatchDebounce = 20 * time.Millisecond
	})
	for i, limit := range []int{7, 9} {
		name := "..2026_01_01_00_00_00." + strconv.Itoa(i+2)
		version(name, withLimit(limit))
		swapLink(t, name, filepath.Join(vol, "..data"))
		if err := os.RemoveAll(filepath.Join(vol, "..2026_01_01_00_00_00."+strconv.Itoa(i+1))); err != nil {
			t.Fatal(err)
		}
		if took, ok := waitFor(3*time.Second, func() bool { return td.limitOf(t) == int64(limit) }); !ok {
			t.Fatalf("update %d: %s later the limit is %d, want %d", i+1, took, td.limitOf(t), limit)
		}
	}
}

// A configuration directory replaced whole (removed, and a new one renamed
// into its place, as deploy tools do) is watched anew: later changes of
// the file in the new directory are reloaded too.
func TestReloadAfterTheDirectoryIsReplaced(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "conf")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "sluice.yaml")
	writeFile(t, path, policyText())
	td := start(t, "", func(c *daemon.Config) {
		c.ConfigPath = path
		c.WatchDebounce = 200 * time.Millisecond
	})
	next := filepath.Join(root, "conf.new")
	if err := os.Mkdir(next, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(next, "sluice.yaml"), withLimit(7))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, dir); err != nil {
		t.Fatal(err)
	}
	if took, ok := waitFor(3*time.Second, func() bool { return td.limitOf(t) == 7 }); !ok {
		t.Fatalf("directory replaced: %s later the limit is %d, want 7", took, td.limitOf(t))
	}
	writeFile(t, path, withLimit(9))
	if took, ok := waitFor(3*time.Second, func() bool { return td.limitOf(t) == 9 }); !ok {
		t.Fatalf("the file in the new directory written: %s later the limit is %d, want 9", took, td.limitOf(t))
	}
}
