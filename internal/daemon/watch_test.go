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
