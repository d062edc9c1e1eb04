package daemon_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics/pgtest"
	"github.com/sluicehq/sluice/internal/daemon"
)

// pg is one PostgreSQL server for the package's tests, started by the
// first test that needs it and stopped by TestMain.
var pg struct {
	once sync.Once
	srv  *pgtest.Server
	err  error
}

func pgServer(t testing.TB) *pgtest.Server {
	t.Helper()
	pg.once.Do(func() { pg.srv, pg.err = pgtest.Start() })
	if pg.err != nil {
		t.Fatal(pg.err)
	}
	return pg.srv
}

// TestAnalyticsInPostgres: two regions' instances write to one
// PostgreSQL; checks allowed and blocked, on two resources, in two
// minutes of two hours, are read back exactly from either instance at
// every granularity and in the history of the status answer.
func TestAnalyticsInPostgres(t *testing.T) {
	url := pgServer(t).NewDatabase(t)
	clk := newClock(epoch.Add(10 * time.Second))
	regions := map[string]*testDaemon{}
	for _, region := range []string{"eu", "us"} {
		td := start(t, analyticsPolicy, func(c *daemon.Config) {
			c.Region, c.AnalyticsURL, c.Now = region, url, clk.Now
			c.AnalyticsFlushInterval = time.Hour // the test flushes
		})
		td.clock = clk
		regions[region] = td
	}
	eu, us := regions["eu"], regions["us"]
	ts := newTallies()
	for range 5 {
		ts.checkHTTP(t, eu, "eu", "c1", "/api/a")
	}
	for range 4 {
		ts.checkHTTP(t, eu, "eu", "c2", "/api/b")
	}
	for range 4 {
		ts.checkHTTP(t, us, "us", "c1", "/api/a")
	}
	clk.Advance(61 * time.Minute)
	for range 2 {
		ts.checkHTTP(t, us, "us", "c2", "/api/b")
	}
	for range 4 {
		ts.checkHTTP(t, eu, "eu", "c1", "/api/b")
	}
	clk.Advance(30 * time.Second)
	flush(t, eu, us)
	if ts.all.total != 19 || ts.all.blocked != 5 || len(ts.byRegion) != 2 || len(ts.byResource) != 2 {
		t.Fatalf("the test made %+v checks in %d regions on %d resources, want 19 with 5 blocked, 2 and 2",
			ts.all, len(ts.byRegion), len(ts.byResource))
	}
	for _, td := range []*testDaemon{eu, us} {
		verify(t, td.base, ts, epoch.Add(-time.Hour), epoch.Add(2*time.Hour))
		verifyHistory(t, td.base, ts)
	}
	// Each region alone.
	for region, w := range ts.byRegion {
		a := analyticsAnswer(t, eu.base, "granularity=hour&start_time=2027-01-15T00:00:00Z&end_time=2027-01-16T00:00:00Z&region="+region)
		if a.Summary.TotalRequests != w.total || a.Summary.Blocked != w.blocked || len(a.ByRegion) != 1 {
			t.Errorf("region %s: %+v, want %+v", region, a.Summary, w)
		}
	}
}

// TestAnalyticsPostgresOutage: PostgreSQL killed while checks go on. The
// checks answer as before; the analytics answer from memory meanwhile,
// saying so, with the sink unhealthy; what overflowed the backlog is the
// gap, counted in the answer and the metrics; after a restart the writes
// resume and PostgreSQL has everything but the gap.
func TestAnalyticsPostgresOutage(t *testing.T) {
	// A server of its own: the other tests must not see it killed.
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const backlog = 5
	td := start(t, analyticsPolicy, func(c *daemon.Config) {
		c.AnalyticsURL, c.AnalyticsMaxBacklog = srv.NewDatabase(t), backlog
		c.AnalyticsFlushInterval = time.Hour // the test flushes
	})
	td.clock.Advance(10 * time.Second)
	// Every check from a client of its own, so that each is one rollup and
	// the rollups dropped are the checks missing.
	n := 0
	checks := func(count int) {
		t.Helper()
		for range count {
			n++
			if r := td.check(t, fmt.Sprintf(`{"client_id":"c%d","resource":"/api/a"}`, n)); r.status != 200 {
				t.Fatalf("check %d: %d %s", n, r.status, r.raw)
			}
		}
	}
	rng := "granularity=hour&start_time=2027-01-15T07:00:00Z&end_time=2027-01-15T10:00:00Z"
	checks(3)
	flush(t, td)
	if a := analyticsAnswer(t, td.base, rng); a.Source != "postgres" || a.Summary.TotalRequests != 3 || !a.Gaps.SinkHealthy {
		t.Fatalf("before the outage: %+v", a)
	}

	srv.Kill()
	t.Cleanup(func() { srv.Restart() })
	checks(20)
	flush(t, td)
	a := analyticsAnswer(t, td.base, rng)
	if a.Source != "memory" || a.Summary.TotalRequests != 23 || a.Gaps.SinkHealthy || a.Gaps.SinkDroppedRows != 20-backlog {
		t.Errorf("during the outage: source %s, %d requests, gaps %+v; want memory's 23, unhealthy, %d dropped",
			a.Source, a.Summary.TotalRequests, a.Gaps, 20-backlog)
	}
	if r := get(t, td.base+"/api/v1/status/c4?resource=/api/a&include_history=true"); r.status != 200 || r.num("last_24h_requests") != 1 {
		t.Errorf("history during the outage: %d %s", r.status, r.raw)
	}
	for _, m := range []string{"sluice_analytics_sink_up 0", fmt.Sprintf("sluice_analytics_sink_dropped_rows_total %d", 20-backlog)} {
		if r := get(t, td.base+"/metrics"); !strings.Contains(r.raw, m) {
			t.Errorf("metrics during the outage lack %q", m)
		}
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	checks(4)
	// The pool finds its old connections dead on first use; a flush or two
	// may go by before it has new ones.
	for i := 0; ; i++ {
		flush(t, td)
		if st := td.Analytics().Stats(); !st.SinkFailing && st.SinkBacklogRows == 0 {
			break
		}
		if i == 20 {
			t.Fatalf("backlog not written after the restart: %+v", td.Analytics().Stats())
		}
		time.Sleep(100 * time.Millisecond)
	}
	a = analyticsAnswer(t, td.base, rng)
	if want := int64(3 + backlog + 4); a.Source != "postgres" || a.Summary.TotalRequests != want || !a.Gaps.SinkHealthy || a.Gaps.SinkDroppedRows != 20-backlog {
		t.Errorf("after the restart: source %s, %d requests, gaps %+v; want postgres's %d, healthy, %d dropped",
			a.Source, a.Summary.TotalRequests, a.Gaps, want, 20-backlog)
	}
}
