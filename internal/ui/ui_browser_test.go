package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/daemon"
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
// checks, opens /ui/ in headless Chromium, gives the page the token it
// asks for, and reads the charts back: the live checks per resource, the
// block rate, the top limited clients, the policy with its override and
// throttle. Every request the page makes must stay on loopback, and the
// page must throw no error. With SLUICE_UPDATE_SCREENSHOT=1 it saves the
// page to docs/img/dashboard.png.
func TestDashboardInChromium(t *testing.T) {
	browser := findChromium(t)
	var shift atomic.Int64 // how far back the daemon's clock is, for the screenshot's history
	d := startDaemon(t, func() time.Time { return time.Now().Add(-time.Duration(shift.Load())) })
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

	ctx, cancel := chromedp.NewExecAllocator(context.Background(), browserOptions(t, browser)...)
	defer cancel() // ends Chromium and waits for it
	ctx, cancelTab := chromedp.NewContext(ctx, chromedp.WithLogf(t.Logf))
	defer cancelTab()
	ctx, cancelTime := context.WithTimeout(ctx, 60*time.Second)
	defer cancelTime()

	var mu sync.Mutex
	var requests, outside, errs []string
	err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			requests = append(requests, e.Request.URL)
			if !loopback(e.Request.URL) {
				outside = append(outside, e.Request.URL)
			}
		case *network.EventWebSocketCreated:
			if !loopback(e.URL) {
				outside = append(outside, e.URL)
			}
		case *runtime.EventExceptionThrown:
			d := e.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			errs = append(errs, msg)
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				errs = append(errs, "console.error: "+consoleText(e))
			}
		case *cdplog.EventEntryAdded:
			// Security (a Content Security Policy violation) and the
			// like; not the network's, which logs the 401 the page is
			// meant to meet.
			if e.Entry.Level == cdplog.EntryLevelError && e.Entry.Source != cdplog.EntrySourceNetwork {
				errs = append(errs, fmt.Sprintf("%s: %s", e.Entry.Source, e.Entry.Text))
			}
		}
	})
	if err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}

	// The analytics need a viewer's token: the page asks for one.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#login input")),
		chromedp.SendKeys(chromedp.CSS("#login input"), adminToken),
		chromedp.Click(chromedp.CSS("#login button")),
		chromedp.WaitNotVisible(chromedp.CSS("#login")),
	); err != nil {
		t.Fatalf("opening the page and giving it the token: %v", err)
	}

	got := waitPage(ctx, t)
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
	if !slices.Contains(got.Events, "rate_limit_exceeded") {
		t.Errorf("recent events %q, want denials among them", got.Events)
	}
	if got.Notice != "" {
		t.Errorf("the page shows a notice: %q", got.Notice)
	}

	if os.Getenv("SLUICE_UPDATE_SCREENSHOT") == "1" {
		// An hour of history makes a more telling picture than the
		// test's minute; the assertions above are made without it.
		history(t, base, &shift)
		if err := chromedp.Do(ctx, chromedp.Reload()); err != nil {
			t.Fatal(err)
		}
		waitPage(ctx, t)
		saveScreenshot(ctx, t)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(outside) > 0 {
		t.Errorf("the page made requests off loopback: %q", outside)
	}
	if len(requests) < 5 {
		t.Errorf("the page made %d requests, want its files and the APIs: %q", len(requests), requests)
	}
	if len(errs) > 0 {
		t.Errorf("the page threw errors: %q", errs)
	}
}

// pageData is what the page shows, as the test reads it from the DOM.
type pageData struct {
	Refreshed     int
	Live          map[string][2]int64 // resource: allowed, blocked
	LiveAll       [2]int64            // all resources: allowed, blocked
	Clients       map[string][2]int64 // name: total, blocked
	ClientText    []string            // the names written in the chart
	Rate          [2]int64            // total, blocked
	Summary       map[string]float64
	Latency       int
	Rules, Tiers  []string
	Overrides     []string
	Throttles     []string
	RegionsHidden bool
	Events        []string
	Notice        string
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
    Live: live, LiveAll: sums(document.querySelector("#live-charts figure[data-all]")), Clients: clients,
    ClientText: all("#top-clients-chart text.name").map((e) => e.textContent),
    Rate: rate ? [+rate.dataset.total, +rate.dataset.blocked] : [0, 0],
    Summary: summary,
    Latency: all("#latency-chart g.row").length,
    Rules: all("#rules-body tr[data-rule]").map((e) => e.dataset.rule),
    Tiers: all("#tiers-body tr[data-tier]").map((e) => e.dataset.tier),
    Overrides: all("#overrides-body tr[data-override]").map((e) => e.dataset.override),
    Throttles: all("#throttles-body tr[data-throttle]").map((e) => e.dataset.throttle),
    RegionsHidden: document.getElementById("regions").hidden,
    Events: all("#events-body tr[data-type]").map((e) => e.dataset.type),
    Notice: notice.hidden ? "" : notice.textContent,
  };
})()`

// waitPage reads the page until it has refreshed with data (the live
// charts and the policy drawn), or for 20s, and returns what it read last.
func waitPage(ctx context.Context, t *testing.T) pageData {
	t.Helper()
	var got pageData
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if got, err = chromedp.Run(ctx, chromedp.Evaluate[pageData](readPage)); err != nil {
			t.Fatalf("reading the page: %v", err)
		}
		if got.Refreshed > 0 && len(got.Live) == len(wantResources) && len(got.Rules) > 0 && len(got.Throttles) > 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Logf("the page has not drawn everything within 20s: %+v", got)
			return got
		}
		time.Sleep(200 * time.Millisecond)
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
	if len(buf) > 300<<10 {
		t.Fatalf("the screenshot is %d KB, want at most 300 KB", len(buf)>>10)
	}
	path := filepath.Join("..", "..", "docs", "img", "dashboard.png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d KB)", path, len(buf)>>10)
}

// findChromium returns the path of a Chromium or Chrome, installing
// Debian's chromium package with scripts/ensure-chromium.sh (as make deps
// does) when none is found; it skips the test only when that fails too.
func findChromium(t *testing.T) string {
	t.Helper()
	find := func() string {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	out, err := exec.Command("bash", filepath.Join("..", "..", "scripts", "ensure-chromium.sh")).CombinedOutput()
	if p := find(); p != "" {
		return p
	}
	t.Skipf("no Chromium found (chromium, chromium-browser, google-chrome) and scripts/ensure-chromium.sh could not install it (%v):\n%s", err, out)
	return ""
}

// browserOptions runs Chromium headless with a user data directory of its
// own, without the sandbox as root (which it refuses otherwise), and with
// its own background traffic (updates, safe browsing) off.
func browserOptions(t *testing.T, path string) []chromedp.ExecAllocatorOption {
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("no-pings", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	return opts
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

// startDaemon starts a daemon on free loopback ports with the browser
// test's policy, a control plane in a temporary directory, and the clock
// now.
func startDaemon(t *testing.T, now func() time.Time) *daemon.Daemon {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(browserPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Config{
		HTTPAddr:   "127.0.0.1:0",
		GRPCAddr:   "127.0.0.1:0",
		ConfigPath: cfgPath,
		DataDir:    filepath.Join(dir, "data"),
		AdminToken: adminToken,
		Region:     "eu-west",
		Now:        now,
	})
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

// loopback reports whether the URL u stays on this machine: a loopback
// host, or no network at all (data:, blob:, about:).
func loopback(u string) bool {
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	switch p.Scheme {
	case "data", "blob", "about":
		return true
	case "http", "https", "ws", "wss":
	default:
		return false
	}
	h := p.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func consoleText(e *runtime.EventConsoleAPICalled) string {
	var parts []string
	for _, a := range e.Args {
		if len(a.Value) > 0 {
			parts = append(parts, string(a.Value))
		} else {
			parts = append(parts, a.Description)
		}
	}
	return strings.Join(parts, " ")
}

func subset(want, got map[string]float64) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
