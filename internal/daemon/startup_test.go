package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/analytics/pgtest"
	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestStartWithRedisDown starts the daemon on a Redis whose server is not
// running yet: it serves, is not ready (GET /readyz 503, gRPC health
// NOT_SERVING), and decides each check by its rule's failure mode. Once
// the server starts, the daemon is ready within 2s and its checks are
// decided by Redis again, exactly.
func TestStartWithRedisDown(t *testing.T) {
	srv := redistest.Start(t) // for its free port and directory
	srv.Kill()
	td := start(t, failurePolicy, func(c *daemon.Config) {
		c.StoreURL = "redis://" + srv.Addr
		// The guard's defaults, but for a deadline that a busy machine
		// under -race keeps.
		c.Guard = guard.Config{Deadline: 500 * time.Millisecond}
		c.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	health := healthpb.NewHealthClient(dial(t, td.GRPCAddr()))
	serving := func() healthpb.HealthCheckResponse_ServingStatus {
		h, err := health.Check(ctx(t), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("gRPC health: %v", err)
		}
		return h.GetStatus()
	}
	if r := get(t, td.base+"/healthz"); r.status != 200 {
		t.Errorf("healthz with Redis not started: %d %s", r.status, r.raw)
	}
	if r := get(t, td.base+"/readyz"); r.status != 503 {
		t.Errorf("readyz with Redis not started: %d %s, want 503", r.status, r.raw)
	}
	if got := serving(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health with Redis not started: %v, want NOT_SERVING", got)
	}
	source := func(client, resource string) (int, string) {
		r := td.check(t, `{"client_id":"`+client+`","resource":"`+resource+`"}`)
		return r.status, r.header.Get("X-RateLimit-Decision-Source")
	}
	for _, tc := range []struct {
		resource string
		status   int
		source   string
	}{
		{"/open", 200, "fail_open"},
		{"/closed", 503, "fail_closed"},
		{"/local", 200, "local"},
		{"/local", 200, "local"},
		{"/local", 429, "local"}, // the share: 4 over 2 instances
	} {
		if st, src := source("down", tc.resource); st != tc.status || src != tc.source {
			t.Errorf("Redis not started, %s: %d from %s, want %d from %s", tc.resource, st, src, tc.status, tc.source)
		}
	}

	// Long enough for the pauses between attempts to connect to reach
	// their longest.
	time.Sleep(time.Second)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	var ready *response
	took, ok := waitFor(10*time.Second, func() bool {
		ready = get(t, td.base+"/readyz")
		return ready.status == 200
	})
	if !ok {
		t.Fatalf("readyz 10s after Redis started: %d %s", ready.status, ready.raw)
	}
	t.Logf("readyz 200 %s after Redis answered PING", time.Since(up).Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("readyz turned 200 %s after Redis started, want within 2s", took)
	}
	if _, ok := waitFor(2*time.Second, func() bool { return serving() == healthpb.HealthCheckResponse_SERVING }); !ok {
		t.Errorf("gRPC health with Redis up: %v, want SERVING", serving())
	}
	// Exact again: a limit of 4 admits 4, each decided by Redis.
	admitted := 0
	for i := range 8 {
		st, src := source("up", "/local")
		if st == 200 {
			admitted++
			if src != "store" {
				t.Errorf("check %d with Redis up: admitted by %s, want store", i, src)
			}
		}
	}
	if admitted != 4 {
		t.Errorf("a limit of 4 with Redis up admitted %d", admitted)
	}
	if keys, err := srv.Do("KEYS", "*up*"); err != nil || keys == "" {
		t.Errorf("Redis holds no key of the checks: %q, %v", keys, err)
	}
}

// TestExitOnUnavailableStore: with Config.ExitOnUnavailableStore, Start
// fails when Redis does not answer, as it did before the daemon learned
// to wait.
func TestExitOnUnavailableStore(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := daemon.Start(c, daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		StoreURL: "redis://" + srv.Addr, ExitOnUnavailableStore: true})
	if err == nil {
		d.Close()
		t.Fatal("Start succeeded with Redis down")
	}
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Start: %v, want an error wrapping ErrStoreUnavailable", err)
	}
}

// TestShutdownWhileRedisPending: a daemon still waiting for its Redis
// stops at once and leaves no goroutine behind.
func TestShutdownWhileRedisPending(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	d, err := daemon.Start(t.Context(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		StoreURL: "redis://" + srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	begin := time.Now()
	if err := d.Shutdown(c); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("Shutdown took %s", took)
	}
}

// TestStartWithPostgresDown: with PostgreSQL down at start the daemon
// serves and keeps the analytics in memory; once PostgreSQL is up it
// migrates it and writes there what it kept.
func TestStartWithPostgresDown(t *testing.T) {
	// A server of its own: the other tests must not see it killed.
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url := srv.NewDatabase(t) // an empty database, not migrated
	srv.Kill()
	td := start(t, analyticsPolicy, func(c *daemon.Config) {
		c.AnalyticsURL = url
		c.AnalyticsFlushInterval = time.Hour // the test flushes
	})
	td.clock.Advance(10 * time.Second)
	for i := range 5 {
		if r := td.check(t, fmt.Sprintf(`{"client_id":"c%d","resource":"/api/a"}`, i)); r.status != 200 {
			t.Fatalf("check %d with PostgreSQL down: %d %s", i, r.status, r.raw)
		}
	}
	if r := get(t, td.base+"/readyz"); r.status != 200 {
		t.Errorf("readyz with PostgreSQL down: %d %s, want 200 (the analytics do not decide checks)", r.status, r.raw)
	}
	flush(t, td)
	rng := "granularity=hour&start_time=2027-01-15T07:00:00Z&end_time=2027-01-15T10:00:00Z"
	if a := analyticsAnswer(t, td.base, rng); a.Source != "memory" || a.Summary.TotalRequests != 5 || a.Gaps.SinkHealthy {
		t.Errorf("with PostgreSQL down: source %s, %d requests, gaps %+v; want memory's 5, unhealthy", a.Source, a.Summary.TotalRequests, a.Gaps)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, ok := waitFor(20*time.Second, func() bool {
		flush(t, td)
		st := td.Analytics().Stats()
		return !st.SinkFailing && st.SinkBacklogRows == 0
	}); !ok {
		t.Fatalf("backlog not written once PostgreSQL is up: %+v", td.Analytics().Stats())
	}
	if a := analyticsAnswer(t, td.base, rng); a.Source != "postgres" || a.Summary.TotalRequests != 5 || !a.Gaps.SinkHealthy {
		t.Errorf("with PostgreSQL up: source %s, %d requests, gaps %+v; want postgres's 5, healthy", a.Source, a.Summary.TotalRequests, a.Gaps)
	}
}
