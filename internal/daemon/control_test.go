package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control/etcdtest"
	"github.com/sluicehq/sluice/internal/daemon"
)

// etcd is one etcd server for the package's tests, started by the first
// test that needs it.
var etcd struct {
	once sync.Once
	srv  *etcdtest.Server
	err  error
}

// TestMain stops the package's etcd server, if a test started it: the
// process would outlive the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if etcd.srv != nil {
		etcd.srv.Close()
	}
	if natsSrv.srv != nil {
		natsSrv.srv.Close()
	}
	if pg.srv != nil {
		pg.srv.Close()
	}
	os.Exit(code)
}

func etcdServer(t *testing.T) *etcdtest.Server {
	t.Helper()
	etcd.once.Do(func() { etcd.srv, etcd.err = etcdtest.Start() })
	if etcd.err != nil {
		t.Fatal(etcd.err)
	}
	return etcd.srv
}

const controlPolicy = `version: 1
default_tier: free
tiers:
  free: { limit: 10, window: 1m }
  gold: { limit: 500, window: 1m }
rules:
  - id: api
    match: { resource: "/api/*" }
    dimension: user
    tiered: true
`

// controlDaemon starts an instance on etcd under prefix with its own data
// directory dir (a new one when empty), and the admin token.
func controlDaemon(t *testing.T, srv *etcdtest.Server, prefix, dir, token string) *testDaemon {
	if dir == "" {
		dir = t.TempDir()
	}
	return start(t, controlPolicy, func(c *daemon.Config) {
		c.ControlStore = "etcd://" + srv.Endpoint() + "/" + prefix
		c.DataDir = dir
		c.AdminToken = token
	})
}

// adminDo sends an admin request with token and returns the status and body.
func adminDo(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// limitOf reads, consuming nothing, the limit a check of user on client at
// resource gets from d.
func limitOf(t *testing.T, d *testDaemon, client, user, resource string) int64 {
	r := post(t, d.base+"/api/v1/check", fmt.Sprintf(`{"client_id":%q,"user":%q,"resource":%q,"cost":0}`, client, user, resource))
	return r.num("limit")
}

// propagation waits until every instance shows want for the check, and
// returns how long each took from now.
func propagation(t *testing.T, ds []*testDaemon, client, user, resource string, want int64, since time.Time) []time.Duration {
	t.Helper()
	out := make([]time.Duration, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() {
			deadline := since.Add(5 * time.Second)
			for {
				got := limitOf(t, d, client, user, resource)
				if got == want {
					out[i] = time.Since(since)
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("instance %d: limit %d, want %d, 5s after the write", i, got, want)
					out[i] = 5 * time.Second
					return
				}
				time.Sleep(500 * time.Microsecond)
			}
		})
	}
	wg.Wait()
	return out
}

// TestControlPlanePropagation: three instances on one etcd; overrides, tier
// changes, rule changes and 50% throttles written through one instance
// reach all three, observed through the check API, within 200 ms p99 over
// 100 writes; a throttle ends by itself.
func TestControlPlanePropagation(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	srv := etcdServer(t)
	token, _, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var ds []*testDaemon
	for range 3 {
		ds = append(ds, controlDaemon(t, srv, "propagation", "", token))
	}
	admin := ds[0].base
	var lat []time.Duration
	for i := range 100 {
		var (
			method, path, body     string
			client, user, resource = "c", fmt.Sprintf("u-%d", i), "/api/x"
			want                   int64
		)
		switch i % 4 {
		case 0: // an override
			method, path = "POST", "/api/v1/users/"+user+"/override"
			body = fmt.Sprintf(`{"limits":{"api":{"limit":%d}},"duration_seconds":3600,"reason":"load test"}`, 100+i)
			want = int64(100 + i)
		case 1: // a tier change
			method, path, body, want = "PUT", "/api/v1/users/"+user+"/tier", `{"tier":"gold","reason":"upgrade"}`, 500
		case 2: // a rule change
			method, path = "PUT", "/api/v1/rules/extra"
			body = fmt.Sprintf(`{"match":{"resource":"/extra"},"dimension":"user","algorithm":"fixed_window","limit":%d,"window":"1m","reason":"tune"}`, 1000+i)
			resource, want = "/extra", int64(1000+i)
		case 3: // a 50% throttle of one client
			client = fmt.Sprintf("c-%d", i)
			method, path = "POST", "/api/v1/emergency/throttle"
			body = fmt.Sprintf(`{"scope":"client","target":%q,"reduction_percent":50,"duration_seconds":60,"reason":"incident"}`, client)
			want = 5
		}
		t0 := time.Now()
		status, resp := adminDo(t, method, admin+path, token, body)
		if status/100 != 2 {
			t.Fatalf("%s %s: %d %s", method, path, status, resp)
		}
		lat = append(lat, propagation(t, ds, client, user, resource, want, t0)...)
	}
	slices.Sort(lat)
	p50, p99, worst := lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	t.Logf("propagation over %d observations (100 writes x 3 instances): p50 %v, p99 %v, max %v", len(lat), p50, p99, worst)
	// The bound is that of a build without the race detector, which
	// slows each instance several times over (CI reports the figure).
	if p99 > 200*time.Millisecond && !raceEnabled {
		t.Errorf("p99 %v, want at most 200ms", p99)
	}

	// A global throttle ends by itself at its expiry, on every instance.
	// (A minute later: the token has made its 100 writes of this one.)
	for _, d := range ds {
		d.clock.Advance(61 * time.Second)
	}
	if status, resp := adminDo(t, "POST", admin+"/api/v1/emergency/throttle", token,
		`{"scope":"global","reduction_percent":50,"duration_seconds":30,"reason":"incident"}`); status != 200 {
		t.Fatalf("global throttle: %d %s", status, resp)
	}
	propagation(t, ds, "c", "someone", "/api/x", 5, time.Now())
	for _, d := range ds {
		d.clock.Advance(31 * time.Second)
	}
	for i, d := range ds {
		if got := limitOf(t, d, "c", "someone", "/api/x"); got != 10 {
			t.Errorf("instance %d after the throttle's expiry: limit %d, want 10", i, got)
		}
	}
}

// TestControlPlaneEtcdDown: with etcd stopped, checks go on with the
// configuration in force and writes answer 503; an instance restarted
// meanwhile serves the configuration it last applied; once etcd is back, a
// write reaches every instance.
func TestControlPlaneEtcdDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	srv := etcdServer(t)
	token, _, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var ds []*testDaemon
	for _, dir := range dirs {
		ds = append(ds, controlDaemon(t, srv, "outage", dir, token))
	}
	if status, resp := adminDo(t, "POST", ds[0].base+"/api/v1/users/alice/override", token,
		`{"limits":{"api":{"limit":77}},"duration_seconds":3600,"reason":"before the outage"}`); status != 200 && status != 201 {
		t.Fatalf("override: %d %s", status, resp)
	}
	propagation(t, ds, "c", "alice", "/api/x", 77, time.Now())

	srv.Stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			srv.Start()
		}
	})
	for i, d := range ds {
		r := post(t, d.base+"/api/v1/check", `{"client_id":"c","user":"alice","resource":"/api/x"}`)
		if r.status != 200 || r.num("limit") != 77 {
			t.Errorf("instance %d with etcd down: %d %s", i, r.status, r.raw)
		}
	}
	status, resp := adminDo(t, "PUT", ds[1].base+"/api/v1/users/bob/tier", token, `{"tier":"gold","reason":"during the outage"}`)
	if status != http.StatusServiceUnavailable {
		t.Errorf("a write with etcd down: %d %s, want 503", status, resp)
	}
	// Instance 2 restarts while etcd is down: it serves its cached layer.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ds[2].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	ds[2] = controlDaemon(t, srv, "outage", dirs[2], token)
	if got := limitOf(t, ds[2], "c", "alice", "/api/x"); got != 77 {
		t.Errorf("instance restarted with etcd down: limit %d, want 77 (its cached configuration)", got)
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, resp = adminDo(t, "PUT", ds[1].base+"/api/v1/users/bob/tier", token, `{"tier":"gold","reason":"after the outage"}`)
		if status == 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != 200 {
		t.Fatalf("a write once etcd is back: %d %s", status, resp)
	}
	propagation(t, ds, "c", "bob", "/api/x", 500, time.Now())
}

// TestControlPlaneSecureEtcd runs an instance on an etcd that requires
// TLS, a client certificate and a user: the flags' files and the URL's
// user reach the store, and a rule written through the admin API is
// applied.
func TestControlPlaneSecureEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	srv, err := etcdtest.StartConfig(etcdtest.Config{TLS: true, ClientCerts: true, RootPassword: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	token, _, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	d := start(t, controlPolicy, func(c *daemon.Config) {
		c.ControlStore = "etcds://root:pw@" + srv.Endpoint() + "/secure"
		c.ControlCAFile, c.ControlCertFile, c.ControlKeyFile = srv.CAFile(), srv.ClientCertFile(), srv.ClientKeyFile()
		c.DataDir = t.TempDir()
		c.AdminToken = token
	})
	t0 := time.Now()
	body := `{"match":{"resource":"/extra"},"dimension":"user","algorithm":"fixed_window","limit":1234,"window":"1m"}`
	if status, resp := adminDo(t, "PUT", d.base+"/api/v1/rules/extra", token, body); status/100 != 2 {
		t.Fatalf("PUT rule: %d %s", status, resp)
	}
	propagation(t, []*testDaemon{d}, "c", "u", "/extra", 1234, t0)
}
