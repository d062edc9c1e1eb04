package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"

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
// decided by Redis again, exactly. So with a Redis Cluster whose nodes are
// all down, and with a master found by Redis Sentinel, its Sentinels down
// too.
func TestStartWithRedisDown(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Start(t) // for its free port and directory
		srv.Kill()
		startWithRedisDown(t, "redis://"+srv.Addr, func() {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}, []*redistest.Server{srv})
	})
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a Redis Cluster")
		}
		c := redistest.StartCluster(t, redistest.ClusterOptions{})
		for _, s := range c.Servers() {
			s.Kill()
		}
		startWithRedisDown(t, "redis-cluster://"+strings.Join(c.Addrs(), ","), func() {
			for _, s := range c.Servers() {
				if err := s.Restart(); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.WaitOK(30 * time.Second); err != nil {
				t.Fatal(err)
			}
		}, c.Masters)
	})
	t.Run("sentinel", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a primary, a replica and a Sentinel")
		}
		sn := redistest.StartSentinel(t, redistest.SentinelOptions{})
		servers := append([]*redistest.Server{sn.Primary, sn.Replica}, sn.Sentinels...)
		for _, s := range servers {
			s.Kill()
		}
		startWithRedisDown(t, sn.URL(), func() {
			for _, s := range servers {
				if err := s.Restart(); err != nil {
					t.Fatal(err)
				}
			}
		}, []*redistest.Server{sn.Primary})
	})
}

// startWithRedisDown runs TestStartWithRedisDown on the store of storeURL,
// down, which up starts; the keys of the checks are on servers.
func startWithRedisDown(t *testing.T, storeURL string, up func(), servers []*redistest.Server) {
	td := start(t, failurePolicy, func(c *daemon.Config) {
		c.StoreURL = storeURL
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
	up()
	upAt := time.Now()
	var ready *response
	took, ok := waitFor(10*time.Second, func() bool {
		ready = get(t, td.base+"/readyz")
		return ready.status == 200
	})
	if !ok {
		t.Fatalf("readyz 10s after Redis started: %d %s", ready.status, ready.raw)
	}
	t.Logf("readyz 200 %s after Redis answered", time.Since(upAt).Round(time.Millisecond))
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
	var keys []string
	for _, s := range servers {
		k, err := s.Do("KEYS", "*up*")
		if err != nil {
			t.Fatal(err)
		}
		if k != "" {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		t.Error("Redis holds no key of the checks")
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

// TestGRPCMaxConnectionAge: a gRPC connection past its maximum age is
// closed, and the client's calls go on, every one answered, over new
// connections.
func TestGRPCMaxConnectionAge(t *testing.T) {
	td := start(t, policyText(), func(c *daemon.Config) { c.GRPCMaxConnectionAge = 200 * time.Millisecond })
	var conns connCounter
	cc, err := grpc.NewClient(td.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(&conns))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(10 * time.Second)
	calls := 0
	for conns.n.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections after 10s of calls, want a new one every 200ms", conns.n.Load())
		}
		if _, err := health.Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v", calls, err)
		}
		calls++
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d connections over %d calls", conns.n.Load(), calls)
}

// connCounter counts the connections a gRPC client opens.
type connCounter struct{ n atomic.Int32 }

func (c *connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (c *connCounter) HandleRPC(context.Context, stats.RPCStats)                         {}
func (c *connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (c *connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.n.Add(1)
	}
}

// TestStartFailsOnRefusedPassword: waiting for Redis does not mend a
// refused password, so Start fails at once, naming the refusal.
func TestStartFailsOnRefusedPassword(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do("CONFIG", "SET", "requirepass", "right"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"redis://" + srv.Addr, "redis://:wrong@" + srv.Addr} {
		c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		d, err := daemon.Start(c, daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", StoreURL: u})
		cancel()
		if err == nil {
			d.Close()
			t.Errorf("Start with %s succeeded", u)
			continue
		}
		t.Logf("Start with %s: %v", u, err)
		if strings.Contains(err.Error(), "wrong") {
			t.Errorf("Start: %v shows the password", err)
		}
	}
}

// TestReservationsWithRedisDown: on a Redis not running yet, a
// reservation answers 503; once Redis runs, it is granted, in Redis.
func TestReservationsWithRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	td := start(t, `version: 1
rules:
  - {id: orders, match: {resource: "/api/orders"}, limit: 5, window: 1m, algorithm: fixed_window}
`, func(c *daemon.Config) {
		c.StoreURL = "redis://" + srv.Addr
		c.Guard = guard.Config{Deadline: 500 * time.Millisecond}
	})
	const ask = `{"client_id":"a","resource":"/api/orders","tokens_needed":3,"duration_seconds":30}`
	if r := post(t, td.base+"/api/v1/reserve", ask); r.status != 503 {
		t.Errorf("reserve with Redis down: %d %s, want 503", r.status, r.raw)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var r *response
	if _, ok := waitFor(5*time.Second, func() bool {
		r = post(t, td.base+"/api/v1/reserve", ask)
		return r.status == 200
	}); !ok || r.num("tokens_reserved") != 3 {
		t.Fatalf("reserve with Redis up: %d %s", r.status, r.raw)
	}
	if keys, err := srv.Do("KEYS", "*rsv*"); err != nil || keys == "" {
		t.Errorf("Redis holds no key of the reservation: %q, %v", keys, err)
	}
}

// TestShutdownDelay: during Config.ShutdownDelay the daemon is not ready
// (GET /readyz 503, gRPC health NOT_SERVING) and still decides checks;
// then it closes its listeners.
func TestShutdownDelay(t *testing.T) {
	td := start(t, policyText(), func(c *daemon.Config) { c.ShutdownDelay = time.Second })
	health := healthpb.NewHealthClient(dial(t, td.GRPCAddr()))
	done := make(chan error, 1)
	begin := time.Now()
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- td.Shutdown(c)
	}()
	if _, ok := waitFor(time.Second, func() bool { return get(t, td.base+"/readyz").status == 503 }); !ok {
		t.Fatal("readyz not 503 once the shutdown began")
	}
	if r := get(t, td.base+"/readyz"); r.str("status") != "shutting_down" {
		t.Errorf("readyz during the delay: %d %s", r.status, r.raw)
	}
	if r := td.check(t, `{"client_id":"late","resource":"/api/limited"}`); r.status != 200 {
		t.Errorf("check during the delay: %d %s", r.status, r.raw)
	}
	if h, err := health.Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health during the delay: %v, %v; want NOT_SERVING", h.GetStatus(), err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took < time.Second {
		t.Errorf("Shutdown returned after %s, before its delay of 1s", took)
	}
	if _, err := http.Get(td.base + "/healthz"); err == nil {
		t.Error("the HTTP listener still answers after Shutdown")
	}
}

// TestStartWithEtcdDown: with the control plane's etcd not reachable and
// nothing cached, the daemon starts on the configuration file's policy,
// ready: etcd does not decide checks.
func TestStartWithEtcdDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	begin := time.Now()
	td := start(t, policyText(), func(c *daemon.Config) {
		c.DataDir, c.ControlStore = t.TempDir(), "etcd://"+dead
	})
	t.Logf("started in %s", time.Since(begin).Round(time.Millisecond))
	if r := get(t, td.base+"/readyz"); r.status != 200 {
		t.Errorf("readyz with etcd down: %d %s, want 200", r.status, r.raw)
	}
	for i := range 4 {
		r := td.check(t, `{"client_id":"e","resource":"/api/limited"}`)
		if want := []int{200, 200, 200, 429}[i]; r.status != want {
			t.Errorf("check %d with etcd down: %d %s, want %d (the file's limit of 3)", i, r.status, r.raw, want)
		}
	}
}

// TestStartWithNATSDown: with the sync's NATS not reachable, the daemon
// starts at once, ready, and decides checks on what this region knows.
func TestStartWithNATSDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	begin := time.Now()
	td := start(t, policyText(), func(c *daemon.Config) {
		c.Region, c.SyncURL = "eu", "nats://"+dead
	})
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("started in %s with NATS down, want at once", took)
	}
	if r := get(t, td.base+"/readyz"); r.status != 200 {
		t.Errorf("readyz with NATS down: %d %s, want 200", r.status, r.raw)
	}
	if r := td.check(t, `{"client_id":"n","resource":"/api/limited"}`); r.status != 200 {
		t.Errorf("check with NATS down: %d %s", r.status, r.raw)
	}
	if r := get(t, td.base+"/internal/sync"); r.status != 200 || strings.Contains(r.raw, `"connected":true`) {
		t.Errorf("sync status with NATS down: %d %s", r.status, r.raw)
	}
}
