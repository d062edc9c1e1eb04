package daemon_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/store/redis"
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
			// No fixed window here: both paths exported, at 0.
			for _, path := range []string{"plain", "script"} {
				name := `sluice_redis_plain_checks_total{path="` + path + `"}`
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
		// Some of them parse, and name no server that answers: the
		// daemon would wait for it without ExitOnUnavailableStore.
		_, err := daemon.Start(t.Context(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", StoreURL: u, ExitOnUnavailableStore: true})
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

// TestRedisTLS runs a daemon on a Redis that speaks TLS with a
// certificate of a CA made for the test: with that CA (and with the
// server name the certificate holds), checks are decided by the store;
// without it, or with another CA or a name the certificate does not hold,
// Start fails and says why. A server that requires client certificates
// takes the daemon's and refuses it without one.
func TestRedisTLS(t *testing.T) {
	pki := redistest.NewPKI(t)
	srv := redistest.StartTLS(t, &redistest.TLSOptions{PKI: pki})
	mutual := redistest.StartTLS(t, &redistest.TLSOptions{PKI: pki, AuthClients: true})
	other := redistest.NewPKI(t)
	withCert := daemon.RedisOptions{TLSCAFile: pki.CAFile, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile}
	for _, tc := range []struct {
		name    string
		srv     *redistest.Server
		opts    daemon.RedisOptions
		wantErr string // empty: checks are decided by the store; else any of the texts between '|'s
	}{
		{"CA", srv, daemon.RedisOptions{TLSCAFile: pki.CAFile}, ""},
		{"CA and server name", srv, daemon.RedisOptions{TLSCAFile: pki.CAFile, TLSServerName: pki.ServerName}, ""},
		{"no CA", srv, daemon.RedisOptions{}, "certificate signed by unknown authority"},
		{"another CA", srv, daemon.RedisOptions{TLSCAFile: other.CAFile}, "certificate signed by unknown authority"},
		{"wrong server name", srv, daemon.RedisOptions{TLSCAFile: pki.CAFile, TLSServerName: "other.test"}, "not other.test"},
		{"client certificate not asked for", srv, withCert, ""},
		{"client certificate required", mutual, withCert, ""},
		{"client certificate missing", mutual, daemon.RedisOptions{TLSCAFile: pki.CAFile},
			// The server's alert, or the connection reset before it.
			"tls: certificate required|requires a client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A long dial timeout: on a busy machine, under -race, a
			// TLS handshake can outlast the default 1s, and the error
			// would be the timeout's.
			tc.opts.DialTimeout = 10 * time.Second
			storeURL := "rediss://" + tc.srv.TLSAddr
			if tc.wantErr != "" {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				d, err := daemon.Start(ctx, daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", StoreURL: storeURL, Redis: tc.opts})
				if err == nil {
					d.Close()
					t.Fatalf("Start succeeded, want an error with %q", tc.wantErr)
				}
				if !slices.ContainsFunc(strings.Split(tc.wantErr, "|"), func(s string) bool { return strings.Contains(err.Error(), s) }) {
					t.Errorf("Start: %v, want an error with %q", err, tc.wantErr)
				}
				t.Logf("Start: %v", err)
				return
			}
			client := strings.ReplaceAll(tc.name, " ", "-")
			td := start(t, policyText(), func(c *daemon.Config) {
				c.StoreURL = storeURL
				c.Redis = tc.opts
				c.Guard.Deadline = 5 * time.Second
				c.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			})
			r := td.check(t, `{"client_id":"`+client+`","resource":"/api/limited"}`)
			if r.status != 200 || r.header.Get("X-RateLimit-Decision-Source") != "store" {
				t.Fatalf("check: %d, decision source %q, %s; want 200 decided by the store", r.status, r.header.Get("X-RateLimit-Decision-Source"), r.raw)
			}
			keys, err := tc.srv.Do("KEYS", "*"+client+"*")
			if err != nil || keys == "" {
				t.Errorf("the server holds no key of %s: %q, %v", client, keys, err)
			}
		})
	}
}

// TestRedisTLSOptionErrors: a TLS option given for a store without TLS,
// a file that cannot be read or holds no certificate, a certificate
// without its key and a key that is not the certificate's each make Start
// fail with an error naming the option and the file, and never quoting
// the key.
func TestRedisTLSOptionErrors(t *testing.T) {
	pki := redistest.NewPKI(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	key, err := os.ReadFile(pki.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	// A line of the key's base64, which no error may show.
	keyLine := strings.Split(string(key), "\n")[1]
	const tlsURL = "rediss://127.0.0.1:1"
	for _, tc := range []struct {
		name       string
		url        string
		opts       daemon.RedisOptions
		option     string
		file       string
		wantInText string
	}{
		{"CA with redis://", "redis://127.0.0.1:1", daemon.RedisOptions{TLSCAFile: pki.CAFile}, "TLSCAFile", "", "only to rediss://"},
		{"server name with redis-cluster://", "redis-cluster://127.0.0.1:1", daemon.RedisOptions{TLSServerName: "r"}, "TLSServerName", "", "only to rediss://"},
		{"key with memory://", "memory://", daemon.RedisOptions{TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile}, "TLSCertFile", "", "not memory://"},
		{"CA missing", tlsURL, daemon.RedisOptions{TLSCAFile: missing}, "TLSCAFile", missing, "no such file"},
		{"CA file a key", tlsURL, daemon.RedisOptions{TLSCAFile: pki.ClientKeyFile}, "TLSCAFile", pki.ClientKeyFile, "no PEM certificate"},
		{"certificate without key", tlsURL, daemon.RedisOptions{TLSCertFile: pki.ClientCertFile}, "TLSKeyFile", "", "needs its key"},
		{"key without certificate", tlsURL, daemon.RedisOptions{TLSKeyFile: pki.ClientKeyFile}, "TLSCertFile", "", "needs its certificate"},
		{"certificate missing", tlsURL, daemon.RedisOptions{TLSCertFile: missing, TLSKeyFile: pki.ClientKeyFile}, "TLSCertFile", missing, "no such file"},
		{"certificate file a key", tlsURL, daemon.RedisOptions{TLSCertFile: pki.ClientKeyFile, TLSKeyFile: pki.ClientKeyFile}, "TLSCertFile", pki.ClientKeyFile, "no PEM certificate"},
		{"key missing", tlsURL, daemon.RedisOptions{TLSCertFile: pki.ClientCertFile, TLSKeyFile: missing}, "TLSKeyFile", missing, "no such file"},
		{"key of another certificate", tlsURL, daemon.RedisOptions{TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ServerKeyFile}, "TLSKeyFile", pki.ServerKeyFile, "does not match"},
		{"key file a certificate", tlsURL, daemon.RedisOptions{TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientCertFile}, "TLSKeyFile", pki.ClientCertFile, "certificate rather than a key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := daemon.Start(t.Context(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", StoreURL: tc.url, Redis: tc.opts})
			if err == nil {
				d.Close()
				t.Fatal("Start succeeded")
			}
			var te *daemon.RedisTLSError
			if !errors.As(err, &te) || te.Option != tc.option || te.File != tc.file {
				t.Fatalf("Start: %v (%#v), want a RedisTLSError of %s, file %q", err, te, tc.option, tc.file)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.option) || !strings.Contains(msg, tc.file) || !strings.Contains(msg, tc.wantInText) {
				t.Errorf("Start: %v, want the option, the file and %q", err, tc.wantInText)
			}
			if strings.Contains(err.Error(), keyLine) || strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("Start: %v shows the key", err)
			}
		})
	}
}

// TestRedisClusterTLS runs a daemon on a Redis Cluster whose nodes speak
// TLS, to clients and to each other, and require client certificates:
// given the CA and the client certificate, the daemon finds the nodes'
// TLS ports from its seeds and its checks are decided by the store.
func TestRedisClusterTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	pki := redistest.NewPKI(t)
	c := redistest.StartCluster(t, redistest.ClusterOptions{TLS: &redistest.TLSOptions{PKI: pki, AuthClients: true}})
	td := start(t, policyText(), func(cfg *daemon.Config) {
		cfg.StoreURL = "rediss-cluster://" + strings.Join(c.TLSAddrs(), ",")
		cfg.Redis = daemon.RedisOptions{TLSCAFile: pki.CAFile, TLSCertFile: pki.ClientCertFile, TLSKeyFile: pki.ClientKeyFile,
			DialTimeout: 10 * time.Second} // a TLS handshake under -race on a busy machine
		cfg.Guard.Deadline = 5 * time.Second
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	if !td.Guard().Unwrap().(*redis.Store).Cluster() {
		t.Fatal("the store does not see a cluster")
	}
	// Enough clients for their keys to fall on every master.
	for i := range 30 {
		client := strconv.Itoa(i)
		r := td.check(t, `{"client_id":"tls-`+client+`","resource":"/api/limited"}`)
		if r.status != 200 || r.header.Get("X-RateLimit-Decision-Source") != "store" {
			t.Fatalf("check of %s: %d, decision source %q, %s; want 200 decided by the store", client, r.status, r.header.Get("X-RateLimit-Decision-Source"), r.raw)
		}
	}
	for _, m := range c.Masters {
		if keys, err := m.Do("KEYS", "*tls-*"); err != nil || keys == "" {
			t.Errorf("master %s holds no key of the checks: %q, %v", m.Addr, keys, err)
		}
	}
}

// TestPlainChecksCounted: fixed-window checks through the daemon on a
// standalone Redis go plain once the store has read Redis' clock, and
// sluice_redis_plain_checks_total counts every one of them, plain or by
// the script.
func TestPlainChecksCounted(t *testing.T) {
	storeURL := "redis://" + redistest.Start(t).Addr
	td := start(t, `version: 1
rules:
  - id: plain
    match: { resource: /api/plain }
    algorithm: fixed_window
    limit: 1000000
    window: 1h
`, func(c *daemon.Config) {
		c.StoreURL = storeURL
		c.Now = nil // the store decides at Redis' clock, as in production
		c.Guard.Deadline = 5 * time.Second
	})
	plain, script := `sluice_redis_plain_checks_total{path="plain"}`, `sluice_redis_plain_checks_total{path="script"}`
	sent := 0
	// The store starts reading Redis' clock at its first fixed-window
	// check, and sends checks plain once it has a reading.
	for deadline := time.Now().Add(10 * time.Second); ; {
		for range 20 {
			if r := td.check(t, `{"client_id":"c`+strconv.Itoa(sent)+`","resource":"/api/plain"}`); r.status != 200 {
				t.Fatalf("check %d: %d %s", sent, r.status, r.raw)
			}
			sent++
		}
		m := scrape(t, td.base+"/metrics")
		if m[plain] > 0 {
			if got := m[plain] + m[script]; got != float64(sent) {
				t.Errorf("%s + %s = %v + %v, want the %d checks sent", plain, script, m[plain], m[script], sent)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no check went plain in 10 s: %s = %v after %d checks", script, m[script], sent)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
