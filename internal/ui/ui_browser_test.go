package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/analytics/pgtest"
	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/globalsync/natstest"
)

// The policy of the browser test: two resources limited per client by
// token buckets that refill an hour's worth per hour (so that the counts
// below hold however long the test takes), a tier, and an assignment.
const browserPolicy = `version: 1
tiers:
  free:    { limit: 100,  window: 1m }
  premium: { limit: 1000, window: 1m }
assignments:
  - client: carol
    tier: premium
    limits:
      orders-per-client: { limit: 50 }
rules:
  - id: orders-per-client
    name: Orders per client
    match: { resource: /api/orders }
    algorithm: token_bucket
    limit: 5
    window: 1h
  - id: search-per-client
    match: { resource: /api/search }
    algorithm: token_bucket
    limit: 3
    window: 1h
  - id: reports-by-tier
    match: { resource: /api/reports }
    tiered: true
`

// browserChecks are the checks the test makes: client, resource, how
// many. With the limits above, alice has 3 of 8 orders blocked, bob 1 of 4
// searches.
var browserChecks = []struct {
	client, resource string
	n                int
}{
	{"alice", "/api/orders", 8},
	{"carol", "/api/orders", 2},
	{"bob", "/api/search", 4},
	{"alice", "/api/search", 1},
}

// What the checks come to, per resource and per client.
var (
	wantResources = map[string][2]int64{"/api/orders": {7, 3}, "/api/search": {4, 1}} // allowed, blocked
	wantClients   = map[string][2]int64{"alice": {9, 3}, "bob": {4, 1}}               // total, blocked
)

const adminToken = "slc_browser_test_admin_token_0123456789"

// TestDashboardInChromium starts a daemon with a control plane, makes
// checks, opens /ui/ in headless Chromium, gives the page a wrong token and
// then the right one when it asks, and reads the charts back: the live
// checks per resource, the block rate, the top limited clients, latency,
// the policy with its overrides and throttle, recent denials, changes and
// anomalies; then another
// range, and the live rate of checks made while it looks. Every request the
// page makes must stay on loopback, and the page must throw no error. With
// SLUICE_UPDATE_SCREENSHOT=1 it saves the page to docs/img/dashboard.png.
func TestDashboardInChromium(t *testing.T) {
	br := newBrowser(t)
	ctx := br.ctx
	var shift atomic.Int64 // how far back the daemon's clock is, for the screenshot's history
	d := startDaemon(t, browserPolicy, daemon.Config{
		DataDir:    t.TempDir(),
		AdminToken: adminToken,
		Region:     "eu-west",
		Now:        func() time.Time { return time.Now().Add(-time.Duration(shift.Load())) },
	})
	base := "http://" + d.HTTPAddr()

	for _, c := range browserChecks {
		for range c.n {
			post(t, base+"/api/v1/check", "", fmt.Sprintf(`{"client_id":%q,"resource":%q}`, c.client, c.resource))
		}
	}
	post(t, base+"/api/v1/emergency/throttle", adminToken,
		`{"scope":"client","target":"dave","reduction_percent":40,"duration_seconds":3600,"reason":"browser test"}`)
	post(t, base+"/api/v1/clients/erin/override", adminToken,
		`{"limits":{"search-per-client":{"limit":30}},"duration_seconds":3600,"reason":"browser test"}`)
	// The analytics aggregate in the background, and the control plane
	// applies its changes from its watch: wait for both.
	waitJSON(t, base+"/api/v1/analytics?"+lastMinutes(10), func(v map[string]any) bool {
		s, _ := v["summary"].(map[string]any)
		return s != nil && s["total_requests"] == float64(15)
	})
	waitJSON(t, base+"/api/v1/policy", func(v map[string]any) bool {
		ts, _ := v["throttles"].([]any)
		ovs, _ := v["overrides"].([]any)
		return len(ts) == 1 && len(ovs) == 2
	})
	// An anomaly as the detector records it (finding one takes ten
	// minutes of a client's checks: see internal/analytics).
	d.Analytics().Memory().AddAnomalies(time.Now(), []analytics.Anomaly{{Kind: analytics.AnomalyRequests, Client: "mallory",
		Resource: "/api/search", Region: "eu-west", Minute: time.Now().Truncate(time.Minute).Add(-time.Minute).Unix(), Observed: 1200, Baseline: 80}})

	// The analytics need a viewer's token: the page asks for one, and
	// again when the one it is given is refused.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#login input")),
		chromedp.SendKeys(chromedp.CSS("#login input"), "slc_not_a_token_of_this_sluice_0000000000"),
		chromedp.Click(chromedp.CSS("#login button")),
	); err != nil {
		t.Fatalf("opening the page and giving it a wrong token: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](
		`!document.getElementById("login").hidden && document.getElementById("login-error").textContent.includes("not accepted")`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the page does not ask again after a wrong token: %v", err)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#login input"), adminToken),
		chromedp.Click(chromedp.CSS("#login button")),
		chromedp.WaitNotVisible(chromedp.CSS("#login")),
	); err != nil {
		t.Fatalf("giving the page the token: %v", err)
	}

	got := waitPage(ctx, t, func(p pageData) bool {
		return len(p.Live) == len(wantResources) && len(p.Rules) > 0 && len(p.Throttles) > 0
	})
	t.Logf("the page shows: %+v", got)
	for res, want := range wantResources {
		if g := got.Live[res]; g != want {
			t.Errorf("live chart of %s: allowed, blocked = %v, want %v", res, g, want)
		}
	}
	if got.LiveAll != [2]int64{11, 4} {
		t.Errorf("live chart of all resources: allowed, blocked = %v, want [11 4]", got.LiveAll)
	}
	if len(got.Live) != len(wantResources) {
		t.Errorf("live charts for %v, want %v", got.Live, wantResources)
	}
	for name, want := range wantClients {
		if g := got.Clients[name]; g != want {
			t.Errorf("top limited client %s: total, blocked = %v, want %v (chart: %v)", name, g, want, got.Clients)
		}
		if !slices.Contains(got.ClientText, name) {
			t.Errorf("top limited clients show names %q, want %q among them", got.ClientText, name)
		}
	}
	if _, ok := got.Clients["carol"]; ok {
		t.Errorf("carol, never blocked, is among the top limited clients: %v", got.Clients)
	}
	if got.Rate != [2]int64{15, 4} {
		t.Errorf("block rate chart: total, blocked = %v, want [15 4]", got.Rate)
	}
	if want := map[string]float64{"total_requests": 15, "allowed": 11, "blocked": 4}; !subset(want, got.Summary) {
		t.Errorf("summary = %v, want %v", got.Summary, want)
	}
	if got.Summary["p99_latency_us"] <= 0 || got.Latency < 2 {
		t.Errorf("latency: p99 %v µs, %d rows (want > 0 and all regions plus eu-west)", got.Summary["p99_latency_us"], got.Latency)
	}
	for _, r := range []string{"orders-per-client", "search-per-client", "reports-by-tier"} {
		if !slices.Contains(got.Rules, r) {
			t.Errorf("rules shown %q, want %q among them", got.Rules, r)
		}
	}
	if !slices.Equal(got.Tiers, []string{"free", "premium"}) {
		t.Errorf("tiers shown %q, want [free premium]", got.Tiers)
	}
	if !slices.Equal(got.Overrides, []string{"carol", "erin"}) {
		t.Errorf("overrides shown %q, want [carol erin]", got.Overrides)
	}
	if len(got.Throttles) != 1 {
		t.Errorf("throttles shown %q, want one", got.Throttles)
	}
	if !got.RegionsHidden {
		t.Error("the regions' sync section is shown, but this daemon syncs no regions")
	}
	if !slices.Contains(got.Events, "rate_limit_exceeded") || !slices.Contains(got.Events, "anomaly") {
		t.Errorf("recent events %q, want denials and the anomaly among them", got.Events)
	}
	if !slices.Contains(got.Changes, "emergency_throttle") || !slices.Contains(got.Changes, "rate_limit_config_updated") {
		t.Errorf("changes shown %q, want the throttle and the configuration applied at start among them", got.Changes)
	}
	if got.Notice != "" || got.Source != "memory" {
		t.Errorf("the page shows a notice %q, analytics from %q; want none, from memory", got.Notice, got.Source)
	}

	// Another range: its points are hours, and hold the same checks.
	chooseRange(ctx, t, "24h")
	got = waitPage(ctx, t, func(p pageData) bool { return strings.HasPrefix(p.RangeNote, "hour points") })
	if got.Rate != [2]int64{15, 4} || got.RatePoints != 1 || !strings.HasPrefix(got.RangeNote, "hour points") {
		t.Errorf("last 24 hours: block rate chart total, blocked = %v in %d points (%q), want [15 4] in 1 hour point",
			got.Rate, got.RatePoints, got.RangeNote)
	}

	// Live: checks made now show in the rate since the last poll.
	for range 5 {
		post(t, base+"/api/v1/check", "", `{"client_id":"bob","resource":"/api/search"}`)
	}
	got = waitPage(ctx, t, func(p pageData) bool { return p.Live["/api/search"][1] == 6 })
	if !regexp.MustCompile(`^now 0/s allowed, [0-9.]*[1-9][0-9.]*/s blocked$`).MatchString(got.LiveRate["/api/search"]) {
		t.Errorf("/api/search after 5 more blocked checks: %v, rate %q; want 6 blocked, at a rate above 0/s",
			got.Live["/api/search"], got.LiveRate["/api/search"])
	}
	// A resource never blocked has its live chart too.
	post(t, base+"/api/v1/check", "", `{"client_id":"carol","resource":"/api/reports"}`)
	got = waitPage(ctx, t, func(p pageData) bool { return p.Live["/api/reports"] == [2]int64{1, 0} })
	if got.Live["/api/reports"] != [2]int64{1, 0} {
		t.Errorf("live charts %v, want /api/reports with 1 allowed check", got.Live)
	}

	if os.Getenv("SLUICE_UPDATE_SCREENSHOT") == "1" {
		// An hour of history makes a more telling picture than the
		// test's minute; the assertions above are made without it.
		history(t, base, &shift)
		chooseRange(ctx, t, "1h")
		got = waitPage(ctx, t, func(p pageData) bool { return p.Summary["total_requests"] > 1000 && p.RatePoints > 50 })
		// Two polls more, so that the rate since the last poll is not the
		// history's sudden arrival.
		waitPage(ctx, t, func(p pageData) bool { return p.Refreshed >= got.Refreshed+2 })
		saveScreenshot(ctx, t)
	}
	br.checkClean(t, 10)
}

const regionsPolicy = `version: 1
rules:
  - { id: partner, match: { resource: /partner }, limit: 100, window: 1m, global_limit: 4 }
`

// TestDashboardRegions opens the page of one of two regions that share a
// global limit through a real NATS server and write their analytics to one
// real PostgreSQL, without a control plane: the page asks for no token,
// shows the other region with its sync lag, and both regions' checks, from
// PostgreSQL.
func TestDashboardRegions(t *testing.T) {
	br := newBrowser(t)
	nats, err := natstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nats.Close)
	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	db := pg.NewDatabase(t)
	region := func(name, peer string) string {
		d := startDaemon(t, regionsPolicy, daemon.Config{Region: name, SyncURL: nats.URL(), SyncPeers: []string{peer},
			AnalyticsURL: db, AnalyticsFlushInterval: 100 * time.Millisecond})
		return "http://" + d.HTTPAddr()
	}
	eu, us := region("eu", "us"), region("us", "eu")
	for range 4 {
		post(t, eu+"/api/v1/check", "", `{"client_id":"acme","resource":"/partner"}`)
	}
	for range 3 {
		post(t, us+"/api/v1/check", "", `{"client_id":"acme","resource":"/partner"}`)
	}
	if err := chromedp.Do(br.ctx, chromedp.Navigate(eu+"/ui/")); err != nil {
		t.Fatal(err)
	}
	got := waitPage(br.ctx, t, func(p pageData) bool {
		_, heard := p.Regions["us"]
		return heard && p.LiveAll[0]+p.LiveAll[1] == 7 && p.Latency == 3
	})
	if got.LoginShown {
		t.Error("the page asks for a token, but no API needs one here")
	}
	if got.RegionsHidden {
		t.Error("the regions' section is hidden, but this region syncs with another")
	}
	if lag, ok := got.Regions["us"]; !ok || lag < 0 || len(got.Regions) != 1 {
		t.Errorf("regions shown %v, want us with its sync lag", got.Regions)
	}
	if got.LiveAll[0]+got.LiveAll[1] != 7 || got.Summary["total_requests"] != 7 || got.Latency != 3 {
		t.Errorf("checks shown: live %v, summary %v, %d latency rows; want both regions' 7 checks, and a row for all, eu and us",
			got.LiveAll, got.Summary, got.Latency)
	}
	if row := got.RuleText["partner"]; !strings.Contains(row, "all regions: 4 per 1m") || !strings.Contains(row, "100 per 1m") {
		t.Errorf("rule partner shown as %q, want its limit, 100 per 1m, and its global limit, 4 per 1m", row)
	}
	if got.Source != "postgres" || got.Notice != "" {
		t.Errorf("analytics source %q (notice %q), want postgres", got.Source, got.Notice)
	}
	br.checkClean(t, 10)
}

// pageData is what the page shows, as the test reads it from the DOM.
type pageData struct {
	Refreshed     int
	Live          map[string][2]int64 // resource: allowed, blocked
	LiveAll       [2]int64            // all resources: allowed, blocked
	LiveRate      map[string]string   // resource: the rate since the last poll, as written
	Clients       map[string][2]int64 // name: total, blocked
	ClientText    []string            // the names written in the chart
	Rate          [2]int64            // total, blocked
	Summary       map[string]float64
	Latency       int
	Rules, Tiers  []string
	RuleText      map[string]string // rule id: its row, as written
	Overrides     []string
	Throttles     []string
	RegionsHidden bool
	Regions       map[string]int64 // region: sync lag in ms
	Events        []string
	Changes       []string // the kinds of the changes shown
	Notice        string
	LoginShown    bool
	Source        string // where the analytics came from
	RangeNote     string // the block rate's legend
	RatePoints    int
}

// readPage collects pageData from the data-* attributes of the charts and
// tables.
const readPage = `(() => {
  const all = (q) => [...document.querySelectorAll(q)];
  const live = {};
  const sums = (f) => { const s = f && f.querySelector("svg"); return s ? [+s.dataset.allowed, +s.dataset.blocked] : [0, 0]; };
  for (const f of all("#live-charts figure[data-resource]")) {
    const s = f.querySelector("svg");
    live[f.dataset.resource] = [+s.dataset.allowed, +s.dataset.blocked];
  }
  const clients = {};
  for (const g of all("#top-clients-chart g.row")) clients[g.dataset.name] = [+g.dataset.total, +g.dataset.blocked];
  const rate = document.querySelector("#blockrate-chart svg");
  const summary = {};
  for (const e of all("#summary [data-metric]")) summary[e.dataset.metric] = +(e.dataset.value || 0);
  const notice = document.getElementById("notice");
  return {
    Refreshed: +(document.body.dataset.refreshed || 0),
    Live: live,
    LiveRate: Object.fromEntries(all("#live-charts figure[data-resource]").map((f) => [f.dataset.resource, f.querySelector(".rate").textContent])),
    LiveAll: sums(document.querySelector("#live-charts figure[data-all]")), Clients: clients,
    ClientText: all("#top-clients-chart text.name").map((e) => e.textContent),
    Rate: rate ? [+rate.dataset.total, +rate.dataset.blocked] : [0, 0],
    Summary: summary,
    Latency: all("#latency-chart g.row").length,
    Rules: all("#rules-body tr[data-rule]").map((e) => e.dataset.rule),
    RuleText: Object.fromEntries(all("#rules-body tr[data-rule]").map((e) => [e.dataset.rule, e.textContent])),
    Tiers: all("#tiers-body tr[data-tier]").map((e) => e.dataset.tier),
    Overrides: all("#overrides-body tr[data-override]").map((e) => e.dataset.override),
    Throttles: all("#throttles-body tr[data-throttle]").map((e) => e.dataset.throttle),
    RegionsHidden: document.getElementById("regions").hidden,
    Regions: Object.fromEntries(all("#regions-body tr[data-region]").map((e) => [e.dataset.region, +e.dataset.syncLagMs])),
    LoginShown: !document.getElementById("login").hidden,
    Source: document.getElementById("gaps").dataset.source || "",
    RangeNote: document.getElementById("blockrate-range").textContent,
    RatePoints: rate ? +rate.dataset.points : 0,
    Events: all("#events-body tr[data-type]").map((e) => e.dataset.type),
    Changes: all("#changes-body tr[data-kind]").map((e) => e.dataset.kind),
    Notice: notice.hidden ? "" : notice.textContent,
  };
})()`

// chooseRange picks the range value in the page's select, as a user
// would.
func chooseRange(ctx context.Context, t *testing.T, value string) {
	t.Helper()
	js := fmt.Sprintf(`{ const r = document.getElementById("range"); r.value = %q; r.dispatchEvent(new Event("change")); }`, value)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](js)); err != nil {
		t.Fatalf("choosing the range %s: %v", value, err)
	}
}

// waitPage reads the page until it has refreshed and ready holds of
// what it shows, or for 20s, and returns what it read last.
func waitPage(ctx context.Context, t *testing.T, ready func(pageData) bool) pageData {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[pageData](readPage))
		if err != nil {
			t.Fatalf("reading the page: %v", err)
		}
		if got.Refreshed > 0 && ready(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Logf("the page has not shown what the test waits for within 20s: %+v", got)
			return got
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// saveScreenshot writes the whole page to docs/img/dashboard.png.
func saveScreenshot(ctx context.Context, t *testing.T) {
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if _, err := png.Decode(bytes.NewReader(buf)); err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if len(buf) > 512<<10 {
		t.Fatalf("the screenshot is %d KB, want at most 512 KB", len(buf)>>10)
	}
	path := filepath.Join(repoRoot, "docs", "img", "dashboard.png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d KB)", path, len(buf)>>10)
}

// history makes checks as if made over the last hour, minute by minute
// (the daemon's clock set back by shift): services on /api/reports, and
// clients that go over their limits on /api/orders and /api/search.
func history(t *testing.T, base string, shift *atomic.Int64) {
	t.Helper()
	defer shift.Store(0)
	for m := 58; m >= 1; m-- {
		shift.Store(int64(time.Duration(m) * time.Minute))
		wave := 1 + math.Sin(float64(m)/6)
		for i := range 10 + int(12*wave) {
			post(t, base+"/api/v1/check", "", fmt.Sprintf(`{"client_id":"svc-%d","resource":"/api/reports"}`, i%9))
		}
		for i := range int(6 * wave) {
			client := []string{"scraper-7", "mallory", "batch-export", "dave"}[i%4]
			resource := []string{"/api/search", "/api/orders"}[(m+i)%2]
			post(t, base+"/api/v1/check", "", fmt.Sprintf(`{"client_id":%q,"resource":%q}`, client, resource))
		}
	}
	waitJSON(t, base+"/api/v1/analytics?"+lastMinutes(60), func(v map[string]any) bool {
		s, _ := v["summary"].(map[string]any)
		return s != nil && s["total_requests"].(float64) > 1000
	})
}

// startDaemon starts a daemon with cfg, the policy text, and free
// loopback ports, and stops it when the test ends.
func startDaemon(t *testing.T, policy string, cfg daemon.Config) *daemon.Daemon {
	t.Helper()
	// The daemon runs in a directory of its own and names its file
	// relatively, as `sluice serve --config sluice.yaml` does: the
	// page (and its screenshot) shows "sluice.yaml", not a temporary path.
	dir := t.TempDir()
	t.Chdir(dir)
	cfg.ConfigPath = "sluice.yaml"
	if err := os.WriteFile(filepath.Join(dir, cfg.ConfigPath), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return d
}

func lastMinutes(n int) string {
	end := time.Now().Truncate(time.Minute).Add(time.Minute)
	return url.Values{"start_time": {end.Add(-time.Duration(n) * time.Minute).Format(time.RFC3339)},
		"end_time": {end.Format(time.RFC3339)}, "granularity": {"minute"}}.Encode()
}

func post(t *testing.T, u, token, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("POST %s: %d %s", u, resp.StatusCode, b)
	}
}

// waitJSON GETs u (with the admin token) until ok holds of its answer, or
// fails the test after 10s.
func waitJSON(t *testing.T, u string, ok func(map[string]any) bool) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		var v map[string]any
		if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &v) == nil && ok(v) {
			return
		}
	}
	t.Fatalf("GET %s: still %s", u, last)
}

func subset(want, got map[string]float64) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
