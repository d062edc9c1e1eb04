package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/events"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// clock is a settable clock shared by the engine and the memory store, so
// that windows and expiries are deterministic.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// epoch is a whole minute, so that one-minute fixed windows start at it.
var epoch = time.Unix(1_800_000_000, 0)

// testPolicy is the policy of most tests; %s are the expiry instants of the
// gold (in 2 minutes) and lapsed (a minute ago) assignments.
const testPolicy = `version: 1
defaults:
  algorithm: fixed_window
default_tier: free
tiers:
  free:    { limit: 2, window: 1m }
  premium: { limit: 5, window: 1m }
rules:
  - id: per-client
    match: { resource: /api/limited }
    dimension: client
    limit: 3
    window: 1m
  - id: tiered
    match: { resource: /api/tiered }
    dimension: client
    tiered: true
  - id: shadowed
    match: { resource: /api/shadow }
    dimension: client
    limit: 1
    window: 1m
    shadow: true
  - id: batch-a
    match: { resource: /batch/a }
    dimension: client
    limit: 2
    window: 1m
  - id: batch-b
    match: { resource: /batch/b }
    dimension: client
    limit: 1
    window: 1m
assignments:
  - client: gold
    tier: premium
    expires_at: %s
  - client: lapsed
    tier: premium
    expires_at: %s
  - client: custom
    limits:
      per-client: { limit: 10 }
allow:
  - client: vip
deny:
  - client: banned
`

func policyText() string {
	return fmt.Sprintf(testPolicy, epoch.Add(2*time.Minute).UTC().Format(time.RFC3339), epoch.Add(-time.Minute).UTC().Format(time.RFC3339))
}

// testDaemon is a daemon started for a test, on free ports.
type testDaemon struct {
	*daemon.Daemon
	base  string
	clock *clock
	path  string
}

// start starts a daemon on the memory store with cfgText as its
// configuration file (none when empty) and stops it when the test ends.
func start(t testing.TB, cfgText string, mod ...func(*daemon.Config)) *testDaemon {
	t.Helper()
	td := &testDaemon{clock: newClock(epoch)}
	cfg := daemon.Config{
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
		Now:      td.clock.Now,
	}
	if cfgText != "" {
		td.path = filepath.Join(t.TempDir(), "sluice.yaml")
		if err := os.WriteFile(td.path, []byte(cfgText), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg.ConfigPath = td.path
	}
	for _, m := range mod {
		m(&cfg)
	}
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
	td.Daemon = d
	td.base = "http://" + d.HTTPAddr()
	return td
}

// response is an HTTP answer, read whole.
type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (r *response) num(key string) int64 {
	v, _ := r.body[key].(float64)
	return int64(v)
}

func (r *response) str(key string) string {
	v, _ := r.body[key].(string)
	return v
}

func post(t *testing.T, url, body string) *response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return read(t, resp)
}

func get(t *testing.T, url string) *response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return read(t, resp)
}

func read(t *testing.T, resp *http.Response) *response {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := &response{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("body %s: %v", raw, err)
		}
	}
	return r
}

func (td *testDaemon) check(t *testing.T, body string) *response {
	t.Helper()
	return post(t, td.base+"/api/v1/check", body)
}

// remaining returns the remaining quota of rule for the check, read from
// the status endpoint (which consumes nothing).
func (td *testDaemon) remaining(t *testing.T, clientID, resource, rule string) int64 {
	t.Helper()
	r := get(t, td.base+"/api/v1/status/"+clientID+"?resource="+resource)
	if r.status != 200 {
		t.Fatalf("status: %d %s", r.status, r.raw)
	}
	limits, _ := r.body["limits"].([]any)
	for _, l := range limits {
		m := l.(map[string]any)
		if m["rule"] == rule {
			return int64(m["remaining"].(float64))
		}
	}
	t.Fatalf("status of %s on %s has no rule %s: %s", clientID, resource, rule, r.raw)
	return 0
}

func TestCheckAllowedThenDenied(t *testing.T) {
	td := start(t, policyText())
	for i := range 3 {
		r := td.check(t, `{"client_id":"c1","resource":"/api/limited"}`)
		if r.status != 200 || r.body["allowed"] != true {
			t.Fatalf("check %d: %d %s, want 200 allowed", i, r.status, r.raw)
		}
		if got, want := r.num("remaining"), int64(2-i); got != want {
			t.Errorf("check %d: remaining = %d, want %d", i, got, want)
		}
	}
	r := td.check(t, `{"client_id":"c1","resource":"/api/limited"}`)
	if r.status != 429 {
		t.Fatalf("4th check: %d %s, want 429", r.status, r.raw)
	}
	wantHeaders := map[string]string{
		"X-RateLimit-Limit":           "3",
		"X-RateLimit-Remaining":       "0",
		"X-RateLimit-Reset":           fmt.Sprint(epoch.Add(time.Minute).Unix()),
		"X-RateLimit-Policy":          "per-client",
		"X-RateLimit-State":           "throttled",
		"X-RateLimit-Decision-Source": "store",
		"Retry-After":                 "60",
		"Retry-After-Ms":              "60000",
		"RateLimit-Policy":            `"per-client";q=3`,
		"RateLimit":                   `"per-client";r=0;t=60`,
	}
	for k, want := range wantHeaders {
		if got := r.header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if r.str("error") != "rate_limit_exceeded" || r.str("error_description") == "" || r.num("retry_after") != 60 || r.str("rule") != "per-client" {
		t.Errorf("429 body = %s", r.raw)
	}
	// Another client has its own counter.
	if r := td.check(t, `{"client_id":"c2","resource":"/api/limited"}`); r.status != 200 {
		t.Errorf("other client: %d, want 200", r.status)
	}
	// The next window admits again.
	td.clock.Advance(time.Minute)
	if r := td.check(t, `{"client_id":"c1","resource":"/api/limited"}`); r.status != 200 {
		t.Errorf("next window: %d %s, want 200", r.status, r.raw)
	}
}

func TestWarningHeader(t *testing.T) {
	td := start(t, policyText())
	// custom has a limit of 10 on per-client: 8 used is 80%, 9 is 90%.
	for i := range 9 {
		r := td.check(t, `{"client_id":"custom","resource":"/api/limited"}`)
		warned := r.header.Get("X-RateLimit-Warning") != ""
		if want := i == 8; warned != want {
			t.Errorf("check %d (%d used): warning header %q, want present %v", i, i+1, r.header.Get("X-RateLimit-Warning"), want)
		}
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	td := start(t, policyText())
	long := strings.Repeat("x", 300)
	for _, tt := range []struct{ path, body, field string }{
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited"`, "body"},
		{"/api/v1/check", `{"resource":"/api/limited"}`, "client_id"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited","cost":-1}`, "cost"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited","cost":99999999999}`, "cost"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited","cost":1e40}`, "cost"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited","priority":"urgent"}`, "priority"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited","user":"` + long + `"}`, "user"},
		{"/api/v1/check", `{"client_id":"` + long + `","resource":"/api/limited"}`, "client_id"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited","idempotency_key":"` + long + `"}`, "idempotency_key"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited` + strings.Repeat("/x", 1100) + `"}`, "resource"},
		{"/api/v1/check", "{\"client_id\":\"c1\",\"resource\":\"/api/limited\",\"user\":\"\xff\"}", "user"},
		{"/api/v1/check", `{"client_id":"c1","resource":"/api/limited","colour":"red"}`, "colour"},
		{"/api/v1/batch-check", `{"client_id":"c1","mode":"sometimes","checks":[{"resource":"/api/limited"}]}`, "mode"},
		{"/api/v1/batch-check", `{"client_id":"c1","priority":"urgent","checks":[{"resource":"/api/limited"}]}`, "priority"},
		// A bad check fails the whole batch: the good one before it is
		// not decided either.
		{"/api/v1/batch-check", `{"client_id":"c1","mode":"best_effort","checks":[{"resource":"/api/limited"},{"resource":"/api/limited","cost":-2}]}`, "checks[1].cost"},
		{"/api/v1/batch-check", "{\"client_id\":\"c1\",\"checks\":[{\"resource\":\"/api/limited\"},{\"resource\":\"/api/limited\",\"ip\":\"\xfe\"}]}", "checks[1].ip"},
		{"/api/v1/batch-check", `{"checks":[{"resource":"/api/limited"}]}`, "checks[0].client_id"},
		{"/api/v1/batch-check", `{"checks":[{"client_id":"c1","resource":"/api/limited"},{"resource":"/api/limited"}]}`, "checks[1].client_id"},
		{"/api/v1/batch-check", `{"client_id":"c1","checks":[{"resource":"/api/limited"},{"resource":"/api/limited","cost":1.5}]}`, "checks[1].cost"},
	} {
		r := post(t, td.base+tt.path, tt.body)
		if r.status != 400 || r.str("error") != "invalid_request" || r.str("field") != tt.field {
			t.Errorf("%.80q: %d %s, want 400 invalid_request naming %s", tt.body, r.status, r.raw, tt.field)
		}
	}
	big := `{"client_id":"c1","resource":"/api/limited","user":"` + strings.Repeat("x", 70<<10) + `"}`
	for _, path := range []string{"/api/v1/check", "/api/v1/batch-check"} {
		if r := post(t, td.base+path, big); r.status != 413 || r.str("error") != "request_too_large" || r.str("field") != "body" {
			t.Errorf("%s, 70 KiB body: %d %s, want 413 naming body", path, r.status, r.raw)
		}
	}
	// The same, sent without a Content-Length.
	resp, err := http.Post(td.base+"/api/v1/check", "application/json", io.MultiReader(strings.NewReader(big)))
	if err != nil {
		t.Fatal(err)
	}
	if r := read(t, resp); r.status != 413 || r.str("field") != "body" {
		t.Errorf("chunked 70 KiB body: %d %s, want 413 naming body", r.status, r.raw)
	}
	req, _ := http.NewRequest("POST", td.base+"/api/v1/check", strings.NewReader(`{"client_id":"c1","resource":"/api/limited"}`))
	req.Header.Set("X-Idempotency-Key", long)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r := read(t, resp); r.status != 400 || r.str("field") != "idempotency_key" {
		t.Errorf("long X-Idempotency-Key: %d %s, want 400 naming idempotency_key", r.status, r.raw)
	}
	if r := get(t, td.base+"/api/v1/status/"+long+"?resource=/api/limited"); r.status != 400 || r.str("field") != "client_id" {
		t.Errorf("status of a long client_id: %d %s, want 400 naming client_id", r.status, r.raw)
	}
	if got := td.remaining(t, "c1", "/api/limited", "per-client"); got != 3 {
		t.Errorf("remaining after bad input = %d, want 3", got)
	}
}

func TestStatusConsumesNothing(t *testing.T) {
	td := start(t, policyText())
	td.check(t, `{"client_id":"c1","resource":"/api/limited"}`)
	for range 5 {
		if got := td.remaining(t, "c1", "/api/limited", "per-client"); got != 2 {
			t.Fatalf("remaining = %d, want 2", got)
		}
	}
	// cost 0 reads without consuming.
	r := td.check(t, `{"client_id":"c1","resource":"/api/limited","cost":0}`)
	if r.status != 200 || r.num("remaining") != 2 {
		t.Errorf("cost 0: %d %s, want 200 with remaining 2", r.status, r.raw)
	}
}

func TestBatchModes(t *testing.T) {
	td := start(t, policyText())
	// batch-b admits 1: the second all-or-nothing batch is refused whole,
	// and consumes nothing on batch-a.
	body := `{"client_id":"c1","mode":"all_or_nothing","checks":[{"resource":"/batch/a"},{"resource":"/batch/b"}]}`
	if r := post(t, td.base+"/api/v1/batch-check", body); r.status != 200 || r.body["allowed"] != true {
		t.Fatalf("first batch: %d %s", r.status, r.raw)
	}
	r := post(t, td.base+"/api/v1/batch-check", body)
	if r.status != 429 || r.body["allowed"] != false {
		t.Fatalf("second batch: %d %s, want 429", r.status, r.raw)
	}
	// batch-a alone would pass: its result says the batch denied it.
	first := r.body["results"].([]any)[0].(map[string]any)
	if first["status"] != 429.0 || !strings.Contains(first["error_description"].(string), "all_or_nothing batch") {
		t.Errorf("second batch, first result = %v, want 429 denied with its batch", first)
	}
	if got := td.remaining(t, "c1", "/batch/a", "batch-a"); got != 1 {
		t.Errorf("batch-a remaining after a refused batch = %d, want 1", got)
	}
	// best effort: a allowed, b denied, 207.
	body = `{"client_id":"c1","mode":"best_effort","checks":[{"resource":"/batch/a"},{"resource":"/batch/b"}]}`
	r = post(t, td.base+"/api/v1/batch-check", body)
	if r.status != 207 || r.body["partial"] != true {
		t.Fatalf("best effort: %d %s, want 207 partial", r.status, r.raw)
	}
	results := r.body["results"].([]any)
	a, b := results[0].(map[string]any), results[1].(map[string]any)
	if a["allowed"] != true || a["status"] != 200.0 || b["allowed"] != false || b["status"] != 429.0 || b["resource"] != "/batch/b" {
		t.Errorf("best effort results = %s", r.raw)
	}
	if got := td.remaining(t, "c1", "/batch/a", "batch-a"); got != 0 {
		t.Errorf("batch-a remaining = %d, want 0", got)
	}
}

func TestShadowMode(t *testing.T) {
	td := start(t, policyText())
	for i := range 3 {
		r := td.check(t, `{"client_id":"c1","resource":"/api/shadow"}`)
		if r.status != 200 {
			t.Fatalf("check %d: %d %s, want 200 (shadow rules never deny)", i, r.status, r.raw)
		}
		if got, want := r.body["shadow_denied"], i > 0; got != want {
			t.Errorf("check %d: shadow_denied = %v, want %v", i, got, want)
		}
	}
}

func TestAllowAndDenyLists(t *testing.T) {
	td := start(t, policyText())
	for i := range 10 {
		r := td.check(t, `{"client_id":"vip","resource":"/api/limited"}`)
		if r.status != 200 || r.str("source") != "allow_list" {
			t.Fatalf("vip check %d: %d %s, want 200 from allow_list", i, r.status, r.raw)
		}
		// No limit applies: no header may tell a client that honours them
		// that its quota is spent (remaining 0 of 0).
		for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Policy", "X-RateLimit-State", "RateLimit", "RateLimit-Policy"} {
			if v, ok := r.header[http.CanonicalHeaderKey(k)]; ok {
				t.Fatalf("vip check %d: header %s: %q, want none", i, k, v)
			}
		}
		if got := r.header.Get("X-RateLimit-Decision-Source"); got != "allow_list" {
			t.Errorf("vip check %d: X-RateLimit-Decision-Source %q, want allow_list", i, got)
		}
	}
	r := td.check(t, `{"client_id":"banned","resource":"/anything"}`)
	if r.status != 429 || r.str("source") != "deny_list" || r.header.Get("X-RateLimit-Decision-Source") != "deny_list" {
		t.Errorf("banned: %d %s, want 429 from deny_list", r.status, r.raw)
	}
	if !strings.Contains(r.str("error_description"), "deny list") {
		t.Errorf("banned: %s, want a description naming the deny list", r.raw)
	}
	// A deny-listed check denies its all_or_nothing batch; the other
	// check is told so, not that its caller is deny-listed.
	r = post(t, td.base+"/api/v1/batch-check", `{"checks":[{"client_id":"c1","resource":"/api/limited"},{"client_id":"banned","resource":"/api/limited"}]}`)
	if r.status != 429 {
		t.Fatalf("batch with a banned check: %d %s, want 429", r.status, r.raw)
	}
	results := r.body["results"].([]any)
	first, second := results[0].(map[string]any), results[1].(map[string]any)
	if d := first["error_description"].(string); !strings.Contains(d, "all_or_nothing batch") {
		t.Errorf("the other check's description = %q, want it denied with its batch", d)
	}
	if d := second["error_description"].(string); !strings.Contains(d, "deny list") {
		t.Errorf("the banned check's description = %q, want the deny list", d)
	}
	if got := td.remaining(t, "c1", "/api/limited", "per-client"); got != 3 {
		t.Errorf("c1 remaining after the refused batch = %d, want 3", got)
	}
}

func TestTiersAndOverridesWithExpiry(t *testing.T) {
	td := start(t, policyText())
	limitOf := func(client, resource string) (int64, string) {
		r := td.check(t, `{"client_id":"`+client+`","resource":"`+resource+`","cost":0}`)
		if r.status != 200 {
			t.Fatalf("%s: %d %s", client, r.status, r.raw)
		}
		return r.num("limit"), r.str("tier")
	}
	tests := []struct {
		client, resource string
		limit            int64
		tier             string
	}{
		{"nobody", "/api/tiered", 2, "free"},
		{"gold", "/api/tiered", 5, "premium"},
		{"lapsed", "/api/tiered", 2, "free"},
		{"custom", "/api/limited", 10, ""},
		{"nobody", "/api/limited", 3, ""},
	}
	for _, tt := range tests {
		if got, tier := limitOf(tt.client, tt.resource); got != tt.limit || (tt.tier != "" && tier != tt.tier) {
			t.Errorf("%s on %s: limit %d tier %q, want %d %q", tt.client, tt.resource, got, tier, tt.limit, tt.tier)
		}
	}
	// gold's assignment expires after 2 minutes.
	td.clock.Advance(3 * time.Minute)
	if got, tier := limitOf("gold", "/api/tiered"); got != 2 || tier != "free" {
		t.Errorf("gold after expiry: limit %d tier %q, want 2 free", got, tier)
	}
}

func TestIdempotency(t *testing.T) {
	td := start(t, policyText())
	body := `{"client_id":"c1","resource":"/api/limited","idempotency_key":"k-1"}`
	first := td.check(t, body)
	second := td.check(t, body)
	if first.status != 200 || second.status != 200 || second.str("source") != "idempotent" || second.num("remaining") != first.num("remaining") {
		t.Errorf("repeat: first %s, second %s; want the first decision again", first.raw, second.raw)
	}
	if got := td.remaining(t, "c1", "/api/limited", "per-client"); got != 2 {
		t.Errorf("remaining = %d, want 2 (charged once)", got)
	}
}

func TestHealthReadyMetricsAndConfigStatus(t *testing.T) {
	td := start(t, policyText())
	if r := get(t, td.base+"/healthz"); r.status != 200 {
		t.Errorf("healthz: %d", r.status)
	}
	if r := get(t, td.base+"/readyz"); r.status != 200 || r.str("status") != "ready" {
		t.Errorf("readyz: %d %s", r.status, r.raw)
	}
	r := get(t, td.base+"/metrics")
	if r.status != 200 || !strings.Contains(r.raw, "sluice_config_last_reload_successful 1") {
		t.Errorf("metrics: %d, missing sluice_config_last_reload_successful 1", r.status)
	}
	r = get(t, td.base+"/api/v1/config/status")
	if r.status != 200 || r.str("version") == "" || r.str("path") != td.path {
		t.Errorf("config status: %d %s", r.status, r.raw)
	}
}

func TestDefaultPolicy(t *testing.T) {
	td := start(t, "")
	var last *response
	for range 6 {
		last = td.check(t, `{"client_id":"demo","resource":"/api/v1/demo"}`)
	}
	if last.status != 429 || last.str("rule") != "demo" {
		t.Errorf("6th check of the built-in demo rule: %d %s, want 429", last.status, last.raw)
	}
	// demo does not depend on tiers; the tier comes from api-per-client,
	// which matches too.
	if got := last.header.Get("X-RateLimit-Tier"); got != "free" || last.str("tier") != "free" {
		t.Errorf("tier: header %q, body %q, want free", got, last.str("tier"))
	}
	for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Policy",
		"Retry-After", "Retry-After-Ms", "RateLimit-Policy", "RateLimit"} {
		if last.header.Get(h) == "" {
			t.Errorf("429 lacks header %s", h)
		}
	}
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	resp, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "demo", Resource: "/api/v1/demo"})
	if err != nil || resp.GetAllowed() || resp.GetTier() != "free" {
		t.Errorf("gRPC 7th check: %v %v, want denied with tier free", resp, err)
	}
}

// waitFor polls cond every 10ms until it holds or d passes, and returns
// how long it took.
func waitFor(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReloadOnFileChange(t *testing.T) {
	td := start(t, policyText())
	limit := func() int64 {
		return td.check(t, `{"client_id":"r1","resource":"/api/limited","cost":0}`).num("limit")
	}
	if got := limit(); got != 3 {
		t.Fatalf("limit = %d, want 3", got)
	}
	// A valid change, written in place.
	changed := strings.Replace(policyText(), "limit: 3\n", "limit: 7\n", 1)
	if err := os.WriteFile(td.path, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	took, ok := waitFor(3*time.Second, func() bool { return limit() == 7 })
	if !ok {
		t.Fatalf("the new limit was not in force after %s", took)
	}
	if took > time.Second {
		t.Errorf("the new limit took %s to apply, want at most 1s", took)
	}
	t.Logf("valid change in force after %s", took)

	// An invalid file keeps the policy in force and shows the error.
	if err := os.WriteFile(td.path, []byte(strings.Replace(changed, "limit: 7\n", "limit: 0\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, ok = waitFor(3*time.Second, func() bool {
		return get(t, td.base+"/api/v1/config/status").str("last_error") != ""
	})
	if !ok {
		t.Fatal("the invalid file's error never showed in the config status")
	}
	if got := limit(); got != 7 {
		t.Errorf("limit after an invalid file = %d, want 7 (the policy in force stays)", got)
	}
	if r := get(t, td.base+"/readyz"); !strings.Contains(r.raw, "last_error") {
		t.Errorf("readyz does not show the config error: %s", r.raw)
	}
	if r := get(t, td.base+"/metrics"); !strings.Contains(r.raw, "sluice_config_last_reload_successful 0") {
		t.Error("metrics do not show the failed reload")
	}

	// An editor's rename-replace of a valid file.
	tmp := td.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Replace(policyText(), "limit: 3\n", "limit: 9\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, td.path); err != nil {
		t.Fatal(err)
	}
	took, ok = waitFor(3*time.Second, func() bool { return limit() == 9 })
	if !ok || took > time.Second {
		t.Errorf("rename-replace: in force %v after %s, want within 1s", ok, took)
	}
	if r := get(t, td.base+"/api/v1/config/status"); r.str("last_error") != "" {
		t.Errorf("config status after a valid file still shows an error: %s", r.raw)
	}
}

// A configuration file that is gone for longer than the debounce (a deploy
// tool's rm and cp, a volume remount) is a failed reload; when the same
// contents come back, the watcher applies them and the failure clears.
func TestReloadOfSameFileAfterMissingClearsError(t *testing.T) {
	td := start(t, policyText(), func(c *daemon.Config) { c.WatchDebounce = 20 * time.Millisecond })
	if err := os.Remove(td.path); err != nil {
		t.Fatal(err)
	}
	if _, ok := waitFor(3*time.Second, func() bool { return td.ConfigStatus().LastError != "" }); !ok {
		t.Fatal("the missing file never showed as an error in the config status")
	}
	if err := os.WriteFile(td.path, []byte(policyText()), 0o644); err != nil {
		t.Fatal(err)
	}
	took, ok := waitFor(2*time.Second, func() bool { return td.ConfigStatus().LastError == "" })
	if !ok {
		t.Fatalf("the same valid file is back, but %s later the config status still shows %q", took, td.ConfigStatus().LastError)
	}
	if r := get(t, td.base+"/metrics"); !strings.Contains(r.raw, "sluice_config_last_reload_successful 1") {
		t.Error("metrics still show the failed reload")
	}
}

func TestReloadExplicit(t *testing.T) {
	td := start(t, policyText(), func(c *daemon.Config) { c.WatchDebounce = time.Hour })
	if err := os.WriteFile(td.path, []byte("version: 1\nrules: [{id: x, limit: -1, window: 1s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := td.Reload(); err == nil {
		t.Error("Reload of an invalid file succeeded")
	}
	if st := td.ConfigStatus(); st.LastError == "" || st.Reloads != 1 {
		t.Errorf("status = %+v, want the error and 1 load", st)
	}
	if err := os.WriteFile(td.path, []byte(strings.Replace(policyText(), "limit: 3\n", "limit: 4\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := td.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := td.check(t, `{"client_id":"r1","resource":"/api/limited","cost":0}`).num("limit"); got != 4 {
		t.Errorf("limit after Reload = %d, want 4", got)
	}
}

func TestStartRefusesInvalidConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("version: 1\nrules: [{id: x, limit: 0, window: 1s}]\n"), 0o644)
	_, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", ConfigPath: path})
	if err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Errorf("Start with an invalid file: %v, want an error naming the file", err)
	}
	_, err = daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", StoreURL: "etcd://x"})
	if err == nil {
		t.Error("Start with an unknown store scheme succeeded")
	}
}

// TestGracefulShutdownFinishesInFlight holds a check inside the daemon
// (an event sink blocks on its denial, after the decision and before the
// answer), shuts the daemon down, and sees new connections refused while
// the held check is still answered.
func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var enterOnce, releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock() // a failed test does not leave the check held
	td := start(t, policyText(), func(c *daemon.Config) {
		c.EventSinks = []events.Sink{sinkFunc(func(ev *events.Event) {
			if ev.Type == events.RateLimitExceeded && ev.ClientID == "inflight" {
				enterOnce.Do(func() { close(entered) })
				<-release
			}
		})}
	})
	body := `{"client_id":"inflight","resource":"/api/limited"}`
	for range 3 { // the rule's limit: the next check is denied
		if r := td.check(t, body); r.status != http.StatusOK {
			t.Fatalf("check: %d %s", r.status, r.raw)
		}
	}
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Post(td.base+"/api/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			done <- result{err: err}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- result{status: resp.StatusCode}
	}()
	select {
	case <-entered: // the daemon holds the check
	case r := <-done:
		t.Fatalf("the check was answered before it was held: status %d, err %v", r.status, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the check did not reach the daemon in 10s")
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- td.Shutdown(ctx)
	}()
	// New connections are refused while the check in flight is held.
	// Shutdown closes the listener at some point after it is called: a
	// connection made before then is served, so the test waits for the
	// first refusal.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err := c.Get(td.base + "/healthz")
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("new connections still accepted 5s into the shutdown")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("the held check was answered before it was released: status %d, err %v", r.status, r.err)
	case err := <-shut:
		t.Fatalf("Shutdown returned with a check in flight: %v", err)
	default:
	}
	unblock()
	r := <-done
	if r.err != nil || r.status != http.StatusTooManyRequests {
		t.Errorf("in-flight check: status %d, err %v; want 429", r.status, r.err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestConcurrentChecksExact sends many concurrent checks at one rule and
// counts the admissions.
func TestConcurrentChecksExact(t *testing.T) {
	td := start(t, strings.Replace(policyText(), "limit: 3\n", "limit: 100\n", 1))
	if got := admitConcurrently(t, []*testDaemon{td}, "hot", 400, 50); got != 100 {
		t.Errorf("admitted %d of 400, want exactly 100", got)
	}
}

// admitConcurrently sends n checks of client on /api/limited, spread in
// turn over ds, at most par at a time, and returns how many were admitted.
// The test fails when an admission was not the store's (a failure mode
// applied): the count would not be the limit's.
func admitConcurrently(t *testing.T, ds []*testDaemon, client string, n, par int) int64 {
	t.Helper()
	var (
		mu      sync.Mutex
		sources = map[string]int{}
		wg      sync.WaitGroup
	)
	tr := &http.Transport{MaxIdleConnsPerHost: par}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	sem := make(chan struct{}, par)
	body := []byte(`{"client_id":"` + client + `","resource":"/api/limited"}`)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			resp, err := c.Post(ds[i%len(ds)].base+"/api/v1/check", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			var got struct {
				Source string `json:"source"`
			}
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return
			}
			if err != nil {
				t.Errorf("admitted check: %v", err)
			}
			mu.Lock()
			sources[got.Source]++
			mu.Unlock()
		})
	}
	wg.Wait()
	allowed := 0
	for src, k := range sources {
		allowed += k
		if src != "store" {
			t.Errorf("%d checks admitted by %q, not by the store", k, src)
		}
	}
	return int64(allowed)
}
