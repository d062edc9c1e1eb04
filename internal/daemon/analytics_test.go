package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/analyticsapi"
	"github.com/sluicehq/sluice/internal/daemon"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// analyticsPolicy limits two resources to 3 checks a minute per client.
const analyticsPolicy = `version: 1
defaults:
  algorithm: fixed_window
rules:
  - id: a
    match: { resource: /api/a }
    dimension: client
    limit: 3
    window: 1m
  - id: b
    match: { resource: /api/b }
    dimension: client
    limit: 3
    window: 1m
`

// tally is the counts the test expects, kept from the checks' answers.
type tally struct {
	total, allowed, blocked int64
}

func (t *tally) add(allowed bool) {
	t.total++
	if allowed {
		t.allowed++
	} else {
		t.blocked++
	}
}

// tallies keeps the expected counts by region, client, resource, minute,
// hour and day.
type tallies struct {
	all                                      tally
	byRegion, byClient, byResource, byMinute map[string]*tally
	byHour, byDay, clientDay                 map[string]*tally
}

func newTallies() *tallies {
	return &tallies{byRegion: map[string]*tally{}, byClient: map[string]*tally{}, byResource: map[string]*tally{},
		byMinute: map[string]*tally{}, byHour: map[string]*tally{}, byDay: map[string]*tally{}}
}

func (ts *tallies) add(region, client, resource string, at time.Time, allowed bool) {
	ts.all.add(allowed)
	for _, e := range []struct {
		m map[string]*tally
		k string
	}{{ts.byRegion, region}, {ts.byClient, client}, {ts.byResource, resource},
		{ts.byMinute, at.UTC().Truncate(time.Minute).Format(time.RFC3339)},
		{ts.byHour, at.UTC().Truncate(time.Hour).Format(time.RFC3339)},
		{ts.byDay, at.UTC().Truncate(24 * time.Hour).Format(time.RFC3339)}} {
		if e.m[e.k] == nil {
			e.m[e.k] = &tally{}
		}
		e.m[e.k].add(allowed)
	}
}

// checkHTTP makes one HTTP check and tallies its answer.
func (ts *tallies) checkHTTP(t *testing.T, td *testDaemon, region, client, resource string) {
	t.Helper()
	r := td.check(t, fmt.Sprintf(`{"client_id":%q,"resource":%q}`, client, resource))
	if r.status != 200 && r.status != 429 {
		t.Fatalf("check: %d %s", r.status, r.raw)
	}
	ts.add(region, client, resource, td.clock.Now(), r.status == 200)
}

// analyticsAnswer reads GET /api/v1/analytics?query from base.
func analyticsAnswer(t *testing.T, base, query string) analyticsapi.Answer {
	t.Helper()
	r := get(t, base+"/api/v1/analytics?"+query)
	if r.status != 200 {
		t.Fatalf("analytics?%s: %d %s", query, r.status, r.raw)
	}
	var a analyticsapi.Answer
	if err := json.Unmarshal([]byte(r.raw), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// flush waits until each daemon's recorder has counted (and written) every
// decision made so far.
func flush(t *testing.T, ds ...*testDaemon) {
	t.Helper()
	for _, d := range ds {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := d.Analytics().Flush(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// verify reads the analytics from base at each granularity and compares
// them with ts, then the history of each client.
func verify(t *testing.T, base string, ts *tallies, from, to time.Time) {
	t.Helper()
	rng := "start_time=" + url.QueryEscape(from.UTC().Format(time.RFC3339)) + "&end_time=" + url.QueryEscape(to.UTC().Format(time.RFC3339))
	for _, g := range []struct {
		name   string
		points map[string]*tally
	}{{"minute", ts.byMinute}, {"hour", ts.byHour}, {"day", ts.byDay}} {
		a := analyticsAnswer(t, base, rng+"&granularity="+g.name)
		s := a.Summary
		if s.TotalRequests != ts.all.total || s.Allowed != ts.all.allowed || s.Blocked != ts.all.blocked {
			t.Errorf("%s: summary %+v, want %+v", g.name, s, ts.all)
		}
		if want := float64(ts.all.blocked) / float64(ts.all.total); s.BlockRate != want || s.AvgLatencyUS <= 0 || s.P99LatencyUS <= 0 {
			t.Errorf("%s: block rate %v (want %v), latency avg %v p99 %v", g.name, s.BlockRate, want, s.AvgLatencyUS, s.P99LatencyUS)
		}
		if len(a.ByRegion) != len(ts.byRegion) {
			t.Errorf("%s: regions %+v, want %d", g.name, a.ByRegion, len(ts.byRegion))
		}
		for _, r := range a.ByRegion {
			w := ts.byRegion[r.Region]
			if w == nil || r.TotalRequests != w.total || r.Allowed != w.allowed || r.Blocked != w.blocked {
				t.Errorf("%s: region %+v, want %+v", g.name, r, w)
			}
		}
		if len(a.TimeSeries) != len(g.points) {
			t.Errorf("%s: %d points, want %d: %+v", g.name, len(a.TimeSeries), len(g.points), a.TimeSeries)
		}
		for _, p := range a.TimeSeries {
			w := g.points[p.Timestamp.Format(time.RFC3339)]
			if w == nil || p.TotalRequests != w.total || p.Allowed != w.allowed || p.Blocked != w.blocked {
				t.Errorf("%s: point %+v, want %+v", g.name, p, w)
			}
		}
		for _, top := range []struct {
			got  []analyticsapi.Top
			want map[string]*tally
		}{{a.TopClients, ts.byClient}, {a.TopResources, ts.byResource}} {
			for _, e := range top.got {
				w := top.want[e.Name]
				if w == nil || e.TotalRequests != w.total || e.Blocked != w.blocked {
					t.Errorf("%s: top %+v, want %+v", g.name, e, w)
				}
			}
		}
		// Hours and days are counted whole.
		wantFrom, wantTo := from, to
		if step := map[string]time.Duration{"hour": time.Hour, "day": 24 * time.Hour}[g.name]; step > 0 {
			wantFrom, wantTo = from.Truncate(step), to.Add(step-1).Truncate(step)
		}
		if a.Granularity != g.name || !a.StartTime.Equal(wantFrom) || !a.EndTime.Equal(wantTo) || !a.Gaps.SinkHealthy || a.Gaps.EventsDropped != 0 {
			t.Errorf("%s: answer %+v", g.name, a)
		}
	}
	for client, w := range ts.byClient {
		a := analyticsAnswer(t, base, rng+"&granularity=day&client_id="+client)
		if a.Summary.TotalRequests != w.total || a.Summary.Blocked != w.blocked {
			t.Errorf("client %s: %+v, want %+v", client, a.Summary, w)
		}
	}
}

// verifyHistory compares the history of each client in the status answer
// of base with ts.
func verifyHistory(t *testing.T, base string, ts *tallies) {
	t.Helper()
	for client, w := range ts.byClient {
		r := get(t, base+"/api/v1/status/"+client+"?resource=/api/a&include_history=true")
		if r.status != 200 || r.num("last_24h_requests") != w.total || r.num("last_24h_blocked") != w.blocked ||
			r.body["average_latency_us"].(float64) <= 0 {
			t.Errorf("history of %s: %d %s, want %+v", client, r.status, r.raw, w)
		}
	}
}

// TestAnalyticsInMemory: with no database, the checks of every API are
// counted in process and read back exactly, at every granularity, and in
// the history of the status answer.
func TestAnalyticsInMemory(t *testing.T) {
	td := start(t, analyticsPolicy, func(c *daemon.Config) { c.Region = "eu" })
	td.clock.Advance(10 * time.Second)
	ts := newTallies()
	for range 5 {
		ts.checkHTTP(t, td, "eu", "c1", "/api/a")
	}
	for range 4 {
		ts.checkHTTP(t, td, "eu", "c2", "/api/b")
	}
	// gRPC, a batch and Envoy's API are counted as well.
	g := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	resp, err := g.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "c2", Resource: "/api/a"})
	if err != nil {
		t.Fatal(err)
	}
	ts.add("eu", "c2", "/api/a", td.clock.Now(), resp.GetAllowed())
	b := post(t, td.base+"/api/v1/batch-check", `{"client_id":"c3","mode":"best_effort","checks":[{"resource":"/api/a"},{"resource":"/api/b"}]}`)
	if b.status != 200 {
		t.Fatalf("batch: %d %s", b.status, b.raw)
	}
	ts.add("eu", "c3", "/api/a", td.clock.Now(), true)
	ts.add("eu", "c3", "/api/b", td.clock.Now(), true)
	e := rlsv3.NewRateLimitServiceClient(dial(t, td.GRPCAddr()))
	if _, err := e.ShouldRateLimit(ctx(t), envoyReq("edge", 1, []string{"remote_address", "10.0.0.1"})); err != nil {
		t.Fatal(err)
	}
	ts.add("eu", "10.0.0.1", "edge", td.clock.Now(), true)

	// An hour and a minute later, in another minute and hour.
	td.clock.Advance(61 * time.Minute)
	for range 4 {
		ts.checkHTTP(t, td, "eu", "c1", "/api/a")
	}
	td.clock.Advance(30 * time.Second)
	flush(t, td)
	verify(t, td.base, ts, epoch.Add(-time.Hour), epoch.Add(2*time.Hour))
	verifyHistory(t, td.base, ts)
	if ts.all.total != 17 || ts.all.blocked != 4 {
		t.Errorf("the test made %+v checks, want 17 with 4 blocked", ts.all)
	}

	// The default range is the last hour: the second batch only.
	a := analyticsAnswer(t, td.base, "")
	if a.Summary.TotalRequests != 4 || a.Summary.Blocked != 1 || !a.EndTime.Equal(td.clock.Now().Truncate(time.Second)) {
		t.Errorf("last hour: %+v", a)
	}
	for _, name := range []string{"sluice_analytics_events_total 17", "sluice_analytics_events_dropped_total 0", "sluice_analytics_sink_up 1", "sluice_analytics_anomalies_total 0", "sluice_analytics_changes_dropped_total 0"} {
		if m := get(t, td.base+"/metrics"); !strings.Contains(m.raw, name) {
			t.Errorf("metrics lack %q", name)
		}
	}
}

// TestAnalyticsBadInput: 400 naming the field, and no analytics at all
// with --no-analytics.
func TestAnalyticsBadInput(t *testing.T) {
	td := start(t, analyticsPolicy)
	for q, field := range map[string]string{
		"start_time=2027-01-15T10:00:00Z&end_time=2027-01-15T09:00:00Z": "start_time",
		"start_time=2025-01-01T00:00:00Z&granularity=day":               "start_time",
		"granularity=second":               "granularity",
		"end_time=tomorrow":                "end_time",
		"start_time=2027-01-15%2010:00:00": "start_time",
		"client=x":                         "client",
	} {
		r := get(t, td.base+"/api/v1/analytics?"+q)
		if r.status != 400 || r.str("field") != field || r.str("error") != "invalid_request" {
			t.Errorf("%s: %d %s, want 400 naming %s", q, r.status, r.raw, field)
		}
	}
	if r := post(t, td.base+"/api/v1/analytics", "{}"); r.status != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d %s", r.status, r.raw)
	}

	off := start(t, analyticsPolicy, func(c *daemon.Config) { c.NoAnalytics = true })
	if r := get(t, off.base+"/api/v1/analytics"); r.status != 404 || r.str("error") != "analytics_disabled" {
		t.Errorf("--no-analytics: %d %s", r.status, r.raw)
	}
	if r := get(t, off.base+"/api/v1/status/c1?include_history=true"); r.status != 400 || r.str("field") != "include_history" {
		t.Errorf("--no-analytics, include_history: %d %s", r.status, r.raw)
	}
	if off.Analytics() != nil {
		t.Error("--no-analytics: a recorder runs")
	}
}

// TestAnalyticsNeedsViewer: with a control plane, the analytics are the
// admin API's, for a viewer's token.
func TestAnalyticsNeedsViewer(t *testing.T) {
	td := start(t, analyticsPolicy, func(c *daemon.Config) {
		c.DataDir = t.TempDir()
		c.AdminToken = "slc_test_token_for_analytics"
	})
	if r := get(t, td.base+"/api/v1/analytics"); r.status != http.StatusUnauthorized {
		t.Errorf("no token: %d %s", r.status, r.raw)
	}
	req, _ := http.NewRequest("GET", td.base+"/api/v1/analytics?granularity=hour", nil)
	req.Header.Set("Authorization", "Bearer slc_test_token_for_analytics")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r := read(t, resp); r.status != 200 || r.str("granularity") != "hour" {
		t.Errorf("with a token: %d %s", r.status, r.raw)
	}

	// The configuration applied at start and an emergency throttle are
	// changes of the range.
	if code, b := adminDo(t, "POST", td.base+"/api/v1/emergency/throttle", "slc_test_token_for_analytics",
		`{"scope":"client","target":"bob","reduction_percent":40,"duration_seconds":3600,"reason":"incident 7"}`); code != http.StatusOK {
		t.Fatalf("throttle: %d %s", code, b)
	}
	flush(t, td)
	td.clock.Advance(time.Second) // the range ends before now
	code, body := adminDo(t, "GET", td.base+"/api/v1/analytics", "slc_test_token_for_analytics", "")
	var a analyticsapi.Answer
	if err := json.Unmarshal([]byte(body), &a); code != 200 || err != nil {
		t.Fatalf("%d %s", code, body)
	}
	kinds := map[string]string{}
	for _, c := range a.Changes {
		kinds[c.Kind] = c.Detail
	}
	if d := kinds["emergency_throttle"]; !strings.Contains(d, "throttle") || !strings.Contains(d, "reason: incident 7") {
		t.Errorf("changes lack the throttle: %+v", a.Changes)
	}
	if _, ok := kinds["rate_limit_config_updated"]; !ok {
		t.Errorf("changes lack the configuration applied at start: %+v", a.Changes)
	}
}
