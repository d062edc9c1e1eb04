package daemon_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/logging"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

const failurePolicy = `version: 1
rules:
  - { id: open,   match: { resource: /open },   limit: 100, window: 1m, failure_mode: fail_open }
  - { id: closed, match: { resource: /closed }, limit: 100, window: 1m, failure_mode: fail_closed }
  - { id: local,  match: { resource: /local },  algorithm: fixed_window, limit: 4, window: 1m, failure_mode: local, expected_instances: 2 }
`

// TestRedisDownOverHTTP kills the daemon's Redis and watches what a client
// and an operator see: each rule's failure mode with its decision source,
// 503 (not 429) for fail_closed, /readyz not ready with the breaker open,
// the breaker's state in /metrics; and all back once Redis returns.
func TestRedisDownOverHTTP(t *testing.T) {
	srv := redistest.Start(t)
	td := start(t, failurePolicy, func(c *daemon.Config) {
		c.StoreURL = "redis://" + srv.Addr
		c.Guard = guard.Config{Deadline: 50 * time.Millisecond,
			Breaker: guard.BreakerConfig{MinRequests: 5, OpenTimeout: time.Second, Probes: 1, Sustain: -1}}
	})
	client := "c"
	source := func(resource string) (int, string) {
		r := td.check(t, `{"client_id":"`+client+`","resource":"`+resource+`"}`)
		return r.status, r.header.Get("X-RateLimit-Decision-Source")
	}
	if st, src := source("/open"); st != 200 || src != "store" {
		t.Fatalf("Redis up: %d %s", st, src)
	}
	if r := get(t, td.base+"/readyz"); r.status != 200 || r.str("breaker") != "closed" {
		t.Fatalf("readyz with Redis up: %d %s", r.status, r.raw)
	}
	// A key Redis denied until a known instant is answered in process.
	for range 4 {
		source("/local")
	}
	if st, src := source("/local"); st != 429 || src != "store" {
		t.Fatalf("5th check over a limit of 4: %d from %s", st, src)
	}
	if st, src := source("/local"); st != 429 || src != "over_limit_cache" {
		t.Errorf("then: %d from %s, want 429 from over_limit_cache", st, src)
	}
	if m := get(t, td.base+"/metrics"); !strings.Contains(m.raw, "sluice_over_limit_cache_hits_total 1") {
		t.Errorf("metrics after an over-limit cache hit:\n%s", grepLines(m.raw, "over_limit"))
	}

	srv.Kill()
	client = "d" // c's /local key stays in the over-limit cache, rightly
	for _, tc := range []struct {
		resource string
		status   int
		source   string
	}{
		{"/open", 200, "fail_open"},
		{"/closed", 503, "fail_closed"},
		{"/local", 200, "local"},
		{"/local", 200, "local"},
		{"/local", 429, "local"}, // the share: 4 over 2 instances, counted from the outage
	} {
		if st, src := source(tc.resource); st != tc.status || src != tc.source {
			t.Errorf("Redis down, %s: %d from %s, want %d from %s", tc.resource, st, src, tc.status, tc.source)
		}
	}
	r := td.check(t, `{"client_id":"c","resource":"/closed"}`)
	if r.str("error") != "unavailable" {
		t.Errorf("fail_closed body: %s", r.raw)
	}
	for range 10 {
		source("/open")
	}
	if r := get(t, td.base+"/readyz"); r.status != 503 || r.str("breaker") != "open" || !strings.Contains(r.str("error"), "circuit breaker open") {
		t.Errorf("readyz with Redis down: %d %s", r.status, r.raw)
	}
	if m := get(t, td.base+"/metrics"); !strings.Contains(m.raw, "sluice_breaker_state 2") || !strings.Contains(m.raw, `sluice_breaker_transitions_total{to="open"}`) {
		t.Errorf("metrics with the breaker open lack its state:\n%s", grepLines(m.raw, "breaker"))
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var src string
	if _, ok := waitFor(10*time.Second, func() bool {
		_, src = source("/open")
		return src == "store"
	}); !ok {
		t.Fatalf("Redis back: checks still decided by %s", src)
	}
	// The client may find a dead connection or two before it has
	// replaced them all: readyz turns 200 within moments.
	var ready *response
	if _, ok := waitFor(10*time.Second, func() bool {
		ready = get(t, td.base+"/readyz")
		return ready.status == 200 && ready.str("breaker") == "closed"
	}); !ok {
		t.Errorf("readyz with Redis back: %d %s", ready.status, ready.raw)
	}
	if m := get(t, td.base+"/metrics"); !strings.Contains(m.raw, "sluice_breaker_state 0") {
		t.Errorf("metrics with the breaker closed:\n%s", grepLines(m.raw, "breaker"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestRedisConnectionSettings checks that the connections per node of the
// configuration are the connections Redis sees.
func TestRedisConnectionSettings(t *testing.T) {
	for _, conns := range []int{1, 4} {
		srv := redistest.Start(t)
		td := start(t, failurePolicy, func(c *daemon.Config) {
			c.StoreURL = "redis://" + srv.Addr
			c.Redis = daemon.RedisOptions{ConnsPerNode: conns, KeepAlive: 5 * time.Second, DialTimeout: time.Second}
			c.Guard.Deadline = time.Second
		})
		tr := &http.Transport{MaxIdleConnsPerHost: 64}
		c := &http.Client{Transport: tr}
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				resp, err := c.Post(td.base+"/api/v1/check", "application/json", strings.NewReader(`{"client_id":"c`+strconv.Itoa(i)+`","resource":"/open"}`))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		wg.Wait()
		tr.CloseIdleConnections()
		info, err := srv.Info("clients")
		if err != nil {
			t.Fatal(err)
		}
		// Redis counts the connection asking INFO too.
		if got, want := info["connected_clients"], strconv.Itoa(conns+1); got != want {
			t.Errorf("conns per node %d: Redis sees %s clients, want %s (the store's and INFO's)", conns, got, want)
		}
	}
}

// TestNotReadyWhileRedisRefusesWrites points the daemon at a Redis that
// answers every command but refuses to write (out of memory under
// noeviction, then a read-only replica): every check then follows its
// failure mode, so /readyz must not report the instance ready, whether
// the breaker is closed or probing.
func TestNotReadyWhileRedisRefusesWrites(t *testing.T) {
	for _, tc := range []struct {
		name          string
		refuse, allow func(srv *redistest.Server) error
	}{
		{"out of memory",
			func(srv *redistest.Server) error { _, err := srv.Do("CONFIG", "SET", "maxmemory", "1"); return err },
			func(srv *redistest.Server) error { _, err := srv.Do("CONFIG", "SET", "maxmemory", "0"); return err }},
		{"read-only replica",
			func(srv *redistest.Server) error {
				other := redistest.Start(t)
				_, err := srv.Do("REPLICAOF", "127.0.0.1", strconv.Itoa(other.Port))
				return err
			},
			func(srv *redistest.Server) error { _, err := srv.Do("REPLICAOF", "NO", "ONE"); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			td := start(t, failurePolicy, func(c *daemon.Config) {
				c.StoreURL = "redis://" + srv.Addr
				c.Guard = guard.Config{Deadline: 50 * time.Millisecond,
					Breaker: guard.BreakerConfig{MinRequests: 5, OpenTimeout: 100 * time.Millisecond, Probes: 1, Sustain: -1}}
			})
			source := func() string {
				return td.check(t, `{"client_id":"c","resource":"/open"}`).header.Get("X-RateLimit-Decision-Source")
			}
			if src := source(); src != "store" {
				t.Fatalf("Redis up: decided by %s", src)
			}
			if err := tc.refuse(srv); err != nil {
				t.Fatal(err)
			}
			if src := source(); src != "fail_open" {
				t.Fatalf("Redis refusing writes: decided by %s, want fail_open", src)
			}
			// The breaker closed, then open, then probing on readiness
			// checks alone (a load balancer sends no traffic to an
			// instance that is not ready).
			for i := range 20 {
				if r := get(t, td.base+"/readyz"); r.status != 503 {
					t.Fatalf("readyz %d with Redis refusing writes (breaker %s): %d %s", i, td.Guard().BreakerState(), r.status, r.raw)
				}
				if i == 0 {
					for range 10 {
						source()
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := tc.allow(srv); err != nil {
				t.Fatal(err)
			}
			var r *response
			if _, ok := waitFor(10*time.Second, func() bool {
				r = get(t, td.base+"/readyz")
				return r.status == 200
			}); !ok {
				t.Errorf("readyz with Redis writing again: %d %s", r.status, r.raw)
			}
			if src := source(); src != "store" {
				t.Errorf("Redis writing again: decided by %s", src)
			}
		})
	}
}

// TestLocalShareKeptAcrossOutages kills Redis twice within a window: the
// local limiter counts what it admitted in the first outage against the
// share in the second (those checks were never counted by Redis), rather
// than granting the share afresh.
//
// The outages are kills, whose calls fail at once whatever the deadline,
// so the deadline is long: once Redis is back, the client redials each of
// its connections on its first use, and a check that lands on one not yet
// redialled pays for the dial and the handshake, which on a busy machine
// (under -race) may take longer than a short deadline, and would then be
// answered by the local share.
func TestLocalShareKeptAcrossOutages(t *testing.T) {
	srv := redistest.Start(t)
	td := start(t, failurePolicy, func(c *daemon.Config) {
		c.StoreURL = "redis://" + srv.Addr
		c.Guard = guard.Config{Deadline: 2 * time.Second,
			Breaker: guard.BreakerConfig{MinRequests: 5, OpenTimeout: 100 * time.Millisecond, Probes: 1, Sustain: -1}}
	})
	check := func(client, resource string) (int, string) {
		r := td.check(t, `{"client_id":"`+client+`","resource":"`+resource+`"}`)
		return r.status, r.header.Get("X-RateLimit-Decision-Source")
	}
	backUp := func() {
		t.Helper()
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		var src string
		if _, ok := waitFor(10*time.Second, func() bool {
			_, src = check("probe", "/open")
			return src == "store"
		}); !ok {
			t.Fatalf("Redis back: checks still decided by %s", src)
		}
	}

	srv.Kill()
	// The share: 4 over 2 instances.
	for i, want := range []int{200, 200, 429} {
		if st, src := check("d", "/local"); st != want || src != "local" {
			t.Fatalf("first outage, check %d: %d from %s, want %d from local", i, st, src, want)
		}
	}
	backUp()
	if st, src := check("d", "/local"); st != 200 || src != "store" {
		t.Fatalf("Redis back: %d from %s, want 200 from store", st, src)
	}
	srv.Kill()
	if st, src := check("d", "/local"); st != 429 || src != "local" {
		t.Errorf("second outage in the same window: %d from %s, want 429 from local (the share was used in the first)", st, src)
	}
	if st, src := check("e", "/local"); st != 200 || src != "local" {
		t.Errorf("second outage, another client: %d from %s, want 200 from local", st, src)
	}
}

// TestBreakerStateGaugeFollowsTheBreaker opens the breaker, then lets its
// open timeout pass with no check: the breaker is then half-open (as
// /readyz would say), and sluice_breaker_state must say so too rather
// than the open state it last saw change.
func TestBreakerStateGaugeFollowsTheBreaker(t *testing.T) {
	srv := redistest.Start(t)
	const openTimeout = 300 * time.Millisecond
	td := start(t, failurePolicy, func(c *daemon.Config) {
		c.StoreURL = "redis://" + srv.Addr
		c.Guard = guard.Config{Deadline: 50 * time.Millisecond,
			Breaker: guard.BreakerConfig{MinRequests: 5, OpenTimeout: openTimeout, Probes: 1, Sustain: -1}}
	})
	srv.Kill()
	for range 10 {
		td.check(t, `{"client_id":"c","resource":"/open"}`)
	}
	if m := scrape(t, td.base+"/metrics"); m["sluice_breaker_state"] != 2 {
		t.Fatalf("sluice_breaker_state = %v with Redis down, want 2 (open)", m["sluice_breaker_state"])
	}
	time.Sleep(openTimeout + 100*time.Millisecond)
	m := scrape(t, td.base+"/metrics")
	if got := m["sluice_breaker_state"]; got != 1 {
		t.Errorf("sluice_breaker_state = %v once the open timeout passed, want 1 (half-open)", got)
	}
	if got := m[`sluice_breaker_transitions_total{to="half_open"}`]; got != 1 {
		t.Errorf("transitions to half_open = %v, want 1", got)
	}
}

// TestFailedRequestLogCarriesRequestID asks for a client's status while
// Redis is down (a 503) with an X-Request-Id: the error line logged for it
// must carry the request's id, as every line about a request does.
func TestFailedRequestLogCarriesRequestID(t *testing.T) {
	srv := redistest.Start(t)
	var buf lockedBuffer
	log, err := logging.New(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	td := start(t, failurePolicy, func(c *daemon.Config) {
		c.StoreURL = "redis://" + srv.Addr
		c.Logger = log
		c.Guard = guard.Config{Deadline: 50 * time.Millisecond}
	})
	srv.Kill()
	req, _ := http.NewRequest("GET", td.base+"/api/v1/status/c?resource=/open", nil)
	req.Header.Set("X-Request-Id", "req-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := read(t, resp)
	if r.status < 500 {
		t.Fatalf("status with Redis down: %d %s, want a 5xx", r.status, r.raw)
	}
	line := grepLines(buf.String(), `"request failed"`)
	if line == "" {
		t.Fatalf("no error line for the failed request:\n%s", buf.String())
	}
	if !strings.Contains(line, `"request_id":"req-42"`) {
		t.Errorf("the failed request's line lacks its request_id:\n%s", line)
	}
}
