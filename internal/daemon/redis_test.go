package daemon_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestRedisSharedAcrossDaemons runs two daemons on one Redis (and on a Redis
// Cluster): they share their counts exactly.
func TestRedisSharedAcrossDaemons(t *testing.T) {
	urls := map[string]func(t *testing.T) string{
		"standalone": func(t *testing.T) string { return "redis://" + redistest.Start(t).Addr + "/0" },
		"cluster": func(t *testing.T) string {
			if testing.Short() {
				t.Skip("starts a Redis Cluster")
			}
			return "redis-cluster://" + strings.Join(redistest.StartCluster(t, redistest.ClusterOptions{}).Addrs(), ",")
		},
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			storeURL := url(t)
			// The sliding window log keeps every admission for the whole
			// window, so the count is exact however the burst straddles the
			// wall clock's minutes (the store decides at Redis' clock; a
			// fixed window would start afresh at the minute's turn).
			policy := strings.Replace(policyText(), "    limit: 3\n", "    limit: 60\n    algorithm: sliding_window_log\n", 1)
			// A long store deadline: this test is about exact counts, and
			// under -race on a busy machine a call may take longer than
			// the default 5ms (the guard would then fail open).
			// Warnings (a failed warm-up, the breaker) go to the test's
			// output: they say why a check did not reach the store.
			withRedis := func(c *daemon.Config) {
				c.StoreURL = storeURL
				c.Guard.Deadline = 5 * time.Second
				c.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			}
			ds := []*testDaemon{start(t, policy, withRedis), start(t, policy, withRedis)}
			// The burst starts once each daemon's store has answered a
			// read of the key: the counts then test the sharing, not the
			// store's first moments (a check it refuses fails open).
			for _, d := range ds {
				waitStoreAnswers(t, d, "shared", "/api/limited")
			}
			if got := admitConcurrently(t, ds, "shared", 150, 16); got != 60 {
				t.Errorf("two daemons admitted %d of 150, want exactly 60", got)
			}
			if got := ds[1].remaining(t, "shared", "/api/limited", "per-client"); got != 0 {
				t.Errorf("remaining after the burst = %d, want 0", got)
			}
			m := scrape(t, ds[0].base+"/metrics")
			for _, name := range []string{"sluice_redis_corrupt_state_resets_total", "sluice_redis_tryagain_retries_total"} {
				if v, ok := m[name]; !ok || v != 0 {
					t.Errorf("/metrics: %s = %v (exported %v), want 0", name, v, ok)
				}
			}
		})
	}
}

func TestRedisURLErrors(t *testing.T) {
	for _, u := range []string{"redis://h:x", "redis-cluster://a:1/3", "redis://:secret@127.0.0.1:1",
		// URLs the standard parser refuses, or reads wrongly, with the
		// password in its message: a bad port, and a password holding an
		// unescaped '/', '#' or '?'.
		"redis://:secret@h:x", "rediss://:secret@[::1:6379", "redis-cluster://:secret@a:1,b:x",
		"redis://:se/secret@127.0.0.1:1", "redis://u:secret/x@127.0.0.1:1", "redis://:ab#secret@127.0.0.1:6379",
		"redis://:secret?x@127.0.0.1:1", "redis://:secret#x@127.0.0.1:1", "redis://u?:secret@127.0.0.1:1", "redis://u:sec%zzsecret@127.0.0.1:1"} {
		_, err := daemon.Start(t.Context(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", StoreURL: u})
		if err == nil {
			t.Errorf("Start with %q succeeded", u)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}

// waitStoreAnswers waits, up to 10 s, until td's store answers a read of
// clientID's limits on resource (GET /api/v1/status, which charges
// nothing).
func waitStoreAnswers(t *testing.T, td *testDaemon, clientID, resource string) {
	t.Helper()
	var last *response
	if _, ok := waitFor(10*time.Second, func() bool {
		last = get(t, td.base+"/api/v1/status/"+clientID+"?resource="+resource)
		return last.status == 200
	}); !ok {
		t.Fatalf("the store did not answer a status read in 10 s: %d %s", last.status, last.raw)
	}
}

// TestHotKeySyncsAreTimed checks that the store calls of the hot keys'
// syncs, which the guard makes on its own, show in the store metrics
// under op="sync", as operations.md says.
func TestHotKeySyncsAreTimed(t *testing.T) {
	storeURL := "redis://" + redistest.Start(t).Addr
	td := start(t, `version: 1
rules:
  - id: hot
    match: { resource: /api/hot }
    algorithm: token_bucket
    limit: 1000000
    window: 1m
`, func(c *daemon.Config) {
		c.StoreURL = storeURL
		c.Guard.Deadline = 5 * time.Second
		c.Guard.HotKeys = guard.HotKeyConfig{Enabled: true, Threshold: 100, Window: 100 * time.Millisecond, SyncInterval: 5 * time.Millisecond}
	})
	syncs := `sluice_hot_key_syncs_total`
	timed := `sluice_store_call_duration_seconds_count{op="sync"}`
	deadline := time.Now().Add(10 * time.Second)
	for {
		for range 50 {
			td.check(t, `{"client_id":"hammer","resource":"/api/hot"}`)
		}
		m := scrape(t, td.base+"/metrics")
		if m[syncs] > 0 {
			// Every successful sync was a store call; the scrape of the
			// syncs comes after that of the calls' count.
			if m[timed] == 0 {
				t.Errorf("%s = %v but %s = %v, want the syncs timed", syncs, m[syncs], timed, m[timed])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no hot-key sync in 10s: %s = %v", syncs, m[syncs])
		}
	}
}
