package daemon_test

import (
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

func pgServer(t *testing.T) *pgtest.Server {
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
