package daemon_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/logging"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// scrape reads /metrics and returns every sample by its series, such as
// `sluice_checks_total{api="check",outcome="allowed"}`.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func TestMetricsMove(t *testing.T) {
	td := start(t, policyText()+`envoy:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: { unit: minute, requests_per_unit: 1 }
`)
	before := scrape(t, td.base+"/metrics")
	for range 4 { // per-client admits 3: the 3rd is near the limit, the 4th denied
		td.check(t, `{"client_id":"m1","resource":"/api/limited"}`)
	}
	td.check(t, `{"client_id":"m1","resource":"/api/shadow"}`)
	td.check(t, `{"client_id":"m1","resource":"/api/shadow"}`) // shadow-denied
	td.check(t, `{"client_id":"banned","resource":"/api/limited"}`)
	td.check(t, `{"client_id":"vip","resource":"/api/limited"}`)
	td.check(t, `{"resource":"/api/limited"}`) // invalid
	post(t, td.base+"/api/v1/batch-check", `{"client_id":"m2","mode":"all_or_nothing","checks":[{"resource":"/batch/a"},{"resource":"/batch/b"}]}`)
	rls := rlsv3.NewRateLimitServiceClient(dial(t, td.GRPCAddr()))
	for range 2 {
		if _, err := rls.ShouldRateLimit(ctx(t), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := td.Reload(); err != nil {
		t.Fatal(err)
	}
	after := scrape(t, td.base+"/metrics")

	moved := map[string]float64{
		`sluice_decisions_total{result="allowed",rule="per-client",source="store"}`:          3,
		`sluice_decisions_total{result="denied",rule="per-client",source="store"}`:           1,
		`sluice_decisions_total{result="shadow_denied",rule="shadowed",source="store"}`:      1,
		`sluice_decisions_total{result="denied",rule="deny_list",source="deny_list"}`:        1,
		`sluice_decisions_total{result="allowed",rule="allow_list",source="allow_list"}`:     1,
		`sluice_decisions_total{result="allowed",rule="batch-a",source="store"}`:             1,
		`sluice_decisions_total{result="allowed",rule="edge.remote_address",source="store"}`: 1,
		`sluice_decisions_total{result="denied",rule="edge.remote_address",source="store"}`:  1,
		`sluice_near_limit_total{rule="per-client"}`:                                         1,
		`sluice_checks_total{api="check",outcome="allowed"}`:                                 6,
		`sluice_checks_total{api="check",outcome="denied"}`:                                  2,
		`sluice_checks_total{api="check",outcome="invalid"}`:                                 0, // refused by the HTTP decoder, before the engine
		`sluice_checks_total{api="batch",outcome="allowed"}`:                                 1,
		`sluice_checks_total{api="envoy",outcome="allowed"}`:                                 1,
		`sluice_checks_total{api="envoy",outcome="denied"}`:                                  1,
		`sluice_check_duration_seconds_count{api="check"}`:                                   8,
		`sluice_check_duration_seconds_count{api="envoy"}`:                                   2,
		`sluice_config_reloads_total{result="success"}`:                                      1,
		`sluice_config_reload_duration_seconds_count`:                                        1,
		`sluice_events_total{type="rate_limit_exceeded"}`:                                    3,
		`sluice_events_total{type="rate_limit_config_updated"}`:                              1,
	}
	for series, want := range moved {
		if got := after[series] - before[series]; got != want {
			t.Errorf("%s moved by %v, want %v", series, got, want)
		}
	}
	// Single requests go to Store.Check, several of one check to CheckAll.
	for _, op := range []string{"check", "check_all"} {
		s := `sluice_store_call_duration_seconds_count{op="` + op + `"}`
		if after[s] <= before[s] {
			t.Errorf("%s did not move", s)
		}
	}
	if after[`sluice_check_duration_seconds_bucket{api="check",le="1"}`] < 7 {
		t.Errorf("check latency buckets did not move")
	}
	if _, ok := after[`sluice_check_duration_seconds_bucket{api="check",le="1e-05"}`]; !ok {
		t.Errorf("check latency has no 10µs bucket")
	}
	for _, s := range []string{`sluice_breaker_state`, `sluice_hot_keys`, `sluice_config_last_reload_successful`} {
		if _, ok := after[s]; !ok {
			t.Errorf("series %s missing", s)
		}
	}
	var version bool
	for s, v := range after {
		if strings.HasPrefix(s, `sluice_config_info{version=`) && v == 1 {
			version = true
		}
	}
	if !version {
		t.Errorf("sluice_config_info missing")
	}
}

func TestEventsEndpoint(t *testing.T) {
	// The reloads below are the test's own (Reload, as SIGHUP does), and
	// it counts their events: the file watcher, which would reload the
	// file too once a write settles, waits an hour here. Otherwise a
	// pause of the test between a write and its Reload (or in the middle
	// of a write), longer than the watcher's 100ms, makes two reloads of
	// the file, and two events, as it would for an operator.
	td := start(t, policyText(), func(c *daemon.Config) { c.WatchDebounce = time.Hour })
	for range 5 {
		td.check(t, `{"client_id":"e1","resource":"/api/limited"}`)
	}
	r := get(t, td.base+"/api/v1/events?type=rate_limit_exceeded")
	evs, _ := r.body["events"].([]any)
	if r.status != 200 || len(evs) != 2 {
		t.Fatalf("events: %d %s, want 2 rate_limit_exceeded", r.status, r.raw)
	}
	ev := evs[0].(map[string]any)
	if ev["client_id"] != "e1" || ev["rule"] != "per-client" || ev["severity"] != "warning" || ev["resource"] != "/api/limited" {
		t.Errorf("event = %v", ev)
	}
	for _, bad := range []string{"limit=0", "limit=x", "limit=100000", "limit=1;x", "limit=%zz"} {
		if r := get(t, td.base+"/api/v1/events?"+bad); r.status != 400 || r.str("field") != "limit" {
			t.Errorf("%s: %d %s, want 400 naming limit", bad, r.status, r.raw)
		}
	}
	// A type filter the server cannot read is refused, not dropped (which
	// would answer every type).
	if r := get(t, td.base+"/api/v1/events?type=rate_limit_exceeded;x"); r.status != 400 || r.str("field") != "type" {
		t.Errorf("a type with a ';': %d %s, want 400 naming type", r.status, r.raw)
	}

	// A reload that changes the allow and deny lists reports each change.
	text := strings.Replace(policyText(), "allow:\n  - client: vip\n", "allow:\n  - client: vip2\n  - ip: 10.0.0.0/8\n", 1)
	if err := os.WriteFile(td.path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := td.Reload(); err != nil {
		t.Fatal(err)
	}
	r = get(t, td.base+"/api/v1/events?limit=10")
	got := map[string]string{}
	for _, e := range r.body["events"].([]any) {
		m := e.(map[string]any)
		k := m["type"].(string) + " " + str(m["identity"])
		if _, seen := got[k]; !seen { // newest first
			got[k] = str(m["previous_version"])
		}
	}
	for _, want := range []string{"rate_limit_allow_list_added client:vip2", "rate_limit_allow_list_added ip:10.0.0.0/8", "rate_limit_allow_list_removed client:vip"} {
		if _, ok := got[want]; !ok {
			t.Errorf("no event %q in %v", want, got)
		}
	}
	if got["rate_limit_config_updated "] == "" {
		t.Errorf("config update event without previous_version: %v", got)
	}
	// An invalid file is reported too.
	os.WriteFile(td.path, []byte("version: 1\nrules: [oops"), 0o644)
	td.Reload()
	r = get(t, td.base+"/api/v1/events?type=rate_limit_config_rejected")
	if evs, _ := r.body["events"].([]any); len(evs) != 1 {
		t.Errorf("rejected config: %s", r.raw)
	}
}

func str(v any) string { s, _ := v.(string); return s }

// lockedBuffer is an io.Writer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestLogsNoLinePerAllowedCheck(t *testing.T) {
	var buf lockedBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	td := start(t, policyText(), func(c *daemon.Config) { c.Logger = log })
	base := strings.Count(buf.String(), "\n")
	for range 3 {
		td.check(t, `{"client_id":"l1","resource":"/api/limited"}`)
	}
	if n := strings.Count(buf.String(), "\n") - base; n != 0 {
		t.Errorf("3 allowed checks logged %d lines at info, want 0:\n%s", n, buf.String())
	}
	td.check(t, `{"client_id":"l1","resource":"/api/limited"}`)
	if !strings.Contains(buf.String(), `"event":"rate_limit_exceeded"`) {
		t.Errorf("denial not logged as an audit event:\n%s", buf.String())
	}
}

func TestDebugListener(t *testing.T) {
	if _, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", DebugAddr: "0.0.0.0:0"}); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("non-loopback debug address: %v, want refused", err)
	}
	td := start(t, "", func(c *daemon.Config) { c.DebugAddr = "127.0.0.1:0" })
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/metrics"} {
		resp, err := http.Get("http://" + td.DebugAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}
	// The command line never shows a store's password, whichever form
	// the flag took.
	args := os.Args
	os.Args = []string{"sluice", "serve", "--store=redis://u:secret@h:1", "--store", "rediss://:secret@h/0", "--http-addr", "a@b"}
	defer func() { os.Args = args }()
	r := get(t, "http://"+td.DebugAddr()+"/debug/pprof/cmdline")
	if strings.Contains(r.raw, "secret") || !strings.Contains(r.raw, "--store=redis://u:xxxxx@h:1") || !strings.Contains(r.raw, "a@b") {
		t.Errorf("/debug/pprof/cmdline: %q, want the passwords hidden and the rest as given", r.raw)
	}
	// The API listener does not serve pprof.
	if r := get(t, td.base+"/debug/pprof/"); r.status != 404 {
		t.Errorf("pprof on the API listener: %d, want 404", r.status)
	}
}

var _ events.Sink = (*events.Ring)(nil)

// TestAuditEventsHideAPIKeys denies a check made with an API key and looks
// for the key in the log and on GET /api/v1/events, which any caller of
// the API can read: neither may hold it, only its fingerprint.
func TestAuditEventsHideAPIKeys(t *testing.T) {
	var buf lockedBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	td := start(t, `version: 1
rules:
  - { id: per-key, match: { resource: /k }, dimension: api_key, limit: 1, window: 1m }
`, func(c *daemon.Config) { c.Logger = log })
	const key = "sk_live_0123456789abcdef"
	for range 2 {
		td.check(t, `{"client_id":"c","api_key":"`+key+`","resource":"/k"}`)
	}
	r := get(t, td.base+"/api/v1/events?type=rate_limit_exceeded")
	evs, _ := r.body["events"].([]any)
	if len(evs) != 1 {
		t.Fatalf("events: %s, want one rate_limit_exceeded", r.raw)
	}
	sum := sha256.Sum256([]byte(key))
	if got, want := str(evs[0].(map[string]any)["api_key"]), "sha256:"+hex.EncodeToString(sum[:8]); got != want {
		t.Errorf("event api_key = %q, want %q", got, want)
	}
	if strings.Contains(r.raw, key) {
		t.Errorf("GET /api/v1/events shows the API key: %s", r.raw)
	}
	if !strings.Contains(buf.String(), `"event":"rate_limit_exceeded"`) {
		t.Fatalf("denial not logged:\n%s", buf.String())
	}
	if strings.Contains(buf.String(), key) {
		t.Errorf("the log shows the API key:\n%s", buf.String())
	}
}

// TestEnvoyNearLimitOnlyWhenAdmitted sends Envoy a request whose second
// descriptor is over its limit: the request is denied and the first
// descriptor consumes nothing, so it is no check admitted near its limit,
// however little it has left.
func TestEnvoyNearLimitOnlyWhenAdmitted(t *testing.T) {
	td := start(t, `version: 1
envoy:
  - domain: edge
    descriptors:
      - key: a
        rate_limit: { unit: minute, requests_per_unit: 10 }
      - key: b
        rate_limit: { unit: minute, requests_per_unit: 1 }
`)
	rls := rlsv3.NewRateLimitServiceClient(dial(t, td.GRPCAddr()))
	call := func(descs ...[]string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := rls.ShouldRateLimit(ctx(t), envoyReq("edge", 1, descs...))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	for range 9 { // the 9th leaves 1 of 10: near the limit
		call([]string{"a", "x"})
	}
	call([]string{"b", "x"})
	before := scrape(t, td.base+"/metrics")
	if code := call([]string{"a", "x"}, []string{"b", "x"}); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a and b with b spent: %v, want OVER_LIMIT", code)
	}
	after := scrape(t, td.base+"/metrics")
	if before[`sluice_near_limit_total{rule="edge.a"}`] != 1 {
		t.Errorf("near-limit checks of edge.a before = %v, want 1", before[`sluice_near_limit_total{rule="edge.a"}`])
	}
	s := `sluice_near_limit_total{rule="edge.a"}`
	if got := after[s] - before[s]; got != 0 {
		t.Errorf("%s moved by %v for a denied request that charged edge.a nothing, want 0", s, got)
	}
}

// TestIdempotentReplayCountedAsIdempotent repeats a check with its
// idempotency key: the repeat is decided by the first decision, not by the
// store, and sluice_decisions_total says so, on the memory store (which
// keeps the decisions in process) as on Redis (which keeps them in Redis).
func TestIdempotentReplayCountedAsIdempotent(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testIdempotentReplayCounted(t, start(t, policyText())) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		testIdempotentReplayCounted(t, start(t, policyText(), func(c *daemon.Config) {
			c.StoreURL = "redis://" + srv.Addr
			c.Guard = guard.Config{Deadline: 5 * time.Second} // a busy machine is no store failure
		}))
	})
}

func testIdempotentReplayCounted(t *testing.T, td *testDaemon) {
	body := `{"client_id":"i1","resource":"/api/limited","idempotency_key":"k-1"}`
	td.check(t, body)
	before := scrape(t, td.base+"/metrics")
	if r := td.check(t, body); r.str("source") != "idempotent" {
		t.Fatalf("repeat: %s, want source idempotent", r.raw)
	}
	after := scrape(t, td.base+"/metrics")
	for series, want := range map[string]float64{
		`sluice_decisions_total{result="allowed",rule="per-client",source="idempotent"}`: 1,
		`sluice_decisions_total{result="allowed",rule="per-client",source="store"}`:      0,
	} {
		if got := after[series] - before[series]; got != want {
			t.Errorf("%s moved by %v, want %v", series, got, want)
		}
	}
}

// TestConfigLoadTimeExcludesTheStore starts a daemon while its Redis is
// frozen for a moment, so that its start waits for the store: the time to
// load the configuration must not include that wait.
func TestConfigLoadTimeExcludesTheStore(t *testing.T) {
	srv := redistest.Start(t)
	const wait = 500 * time.Millisecond
	if err := srv.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(wait, func() { srv.Process().Signal(syscall.SIGCONT) })
	begin := time.Now()
	td := start(t, policyText(), func(c *daemon.Config) { c.StoreURL = "redis://" + srv.Addr })
	if took := time.Since(begin); took < wait/2 {
		t.Skipf("the start took %v: it did not wait for the store", took)
	}
	m := scrape(t, td.base+"/metrics")
	if got := m["sluice_config_reload_duration_seconds_sum"]; got >= wait.Seconds()/4 {
		t.Errorf("sluice_config_reload_duration_seconds_sum = %vs after a start that waited about %v for the store, want the configuration's load alone", got, wait)
	}
}

// TestBatchDenialEventsOnlyForTheDenyingRule sends all_or_nothing batches
// that one check's rule, or one check's deny-listed identity, denies: the
// batch's other checks are denied with it, but no rule of theirs denied
// them, and an audit event for them would name a rule (or the deny list)
// that did not deny their caller, and count towards their caller's burst.
func TestBatchDenialEventsOnlyForTheDenyingRule(t *testing.T) {
	td := start(t, policyText())
	batch := func(body string) {
		t.Helper()
		if r := post(t, td.base+"/api/v1/batch-check", body); r.status != 429 && r.status != 200 {
			t.Fatalf("batch: %d %s", r.status, r.raw)
		}
	}
	events := func() []string {
		t.Helper()
		r := get(t, td.base+"/api/v1/events?type=rate_limit_exceeded")
		var out []string
		for _, e := range r.body["events"].([]any) {
			m := e.(map[string]any)
			out = append(out, str(m["client_id"])+" "+str(m["rule"]))
		}
		return out
	}
	// batch-b admits 1 a minute: the second batch is denied by batch-b.
	for range 2 {
		batch(`{"client_id":"b1","mode":"all_or_nothing","checks":[{"resource":"/batch/a"},{"resource":"/batch/b"},{"resource":"/nothing"},{"client_id":"vip","resource":"/batch/a"}]}`)
	}
	if got := events(); len(got) != 1 || got[0] != "b1 batch-b" {
		t.Errorf("events of a batch denied by batch-b: %q, want only [b1 batch-b]", got)
	}
	batch(`{"client_id":"b2","mode":"all_or_nothing","checks":[{"resource":"/batch/a"},{"client_id":"banned","resource":"/batch/a"}]}`)
	if got := events(); len(got) != 2 || got[0] != "banned deny_list" {
		t.Errorf("events after a batch with a deny-listed check: %q, want [banned deny_list] added", got)
	}
}

// TestAuditEventsCarryRequestID denies checks sent with a request id over
// HTTP (X-Request-Id), gRPC and Envoy (x-request-id metadata): each
// rate_limit_exceeded event carries the id as request_id, on GET
// /api/v1/events and in its log line, as every other line about the
// request; a denial sent without one, and the configuration event of the
// start, carry none.
func TestAuditEventsCarryRequestID(t *testing.T) {
	var buf lockedBuffer
	log, err := logging.New(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	td := start(t, `version: 1
rules:
  - { id: one, match: { resource: /r }, dimension: client, limit: 1, window: 1m }
envoy:
  - domain: edge
    descriptors:
      - key: k
        rate_limit: { unit: minute, requests_per_unit: 1 }
`, func(c *daemon.Config) { c.Logger = log })
	for _, id := range []string{"req-http", ""} {
		for range 2 {
			req, _ := http.NewRequest("POST", td.base+"/api/v1/check", strings.NewReader(`{"client_id":"h`+id+`","resource":"/r"}`))
			req.Header.Set("Content-Type", "application/json")
			if id != "" {
				req.Header.Set("X-Request-Id", id)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			read(t, resp)
		}
	}
	conn := dial(t, td.GRPCAddr())
	gctx := metadata.AppendToOutgoingContext(ctx(t), "x-request-id", "req-grpc")
	for range 2 {
		if _, err := sluicev1.NewRateLimiterClient(conn).CheckRateLimit(gctx, &sluicev1.CheckRequest{ClientId: "g", Resource: "/r"}); err != nil {
			t.Fatal(err)
		}
	}
	ectx := metadata.AppendToOutgoingContext(ctx(t), "x-request-id", "req-envoy")
	for range 2 {
		if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ectx, envoyReq("edge", 1, []string{"k", "x"})); err != nil {
			t.Fatal(err)
		}
	}
	// Who was denied, with which request id.
	want := map[string]string{"client hreq-http": "req-http", "client h": "", "client g": "req-grpc", "domain edge": "req-envoy"}
	who := func(m map[string]any) string {
		if d := str(m["domain"]); d != "" {
			return "domain " + d
		}
		return "client " + str(m["client_id"])
	}
	r := get(t, td.base+"/api/v1/events?type=rate_limit_exceeded")
	evs, _ := r.body["events"].([]any)
	if len(evs) != len(want) {
		t.Fatalf("events: %s, want %d rate_limit_exceeded", r.raw, len(want))
	}
	for _, e := range evs {
		m := e.(map[string]any)
		id, has := m["request_id"]
		if w, ok := want[who(m)]; !ok || has != (w != "") || (has && id != w) {
			t.Errorf("event %v: request_id %v, want %q", m, id, w)
		}
	}
	r = get(t, td.base+"/api/v1/events?type=rate_limit_config_updated")
	if evs, _ := r.body["events"].([]any); len(evs) != 1 || strings.Contains(r.raw, "request_id") {
		t.Errorf("configuration events: %s, want one, without a request_id", r.raw)
	}
	lines := 0
	for _, line := range strings.Split(buf.String(), "\n") {
		if !strings.Contains(line, `"msg":"audit event"`) || !strings.Contains(line, `"rate_limit_exceeded"`) {
			continue
		}
		lines++
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		id, has := m["request_id"]
		if w, ok := want[who(m)]; !ok || has != (w != "") || (has && id != w) {
			t.Errorf("log line %s: request_id %v, want %q", line, id, w)
		}
	}
	if lines != len(want) {
		t.Errorf("%d rate_limit_exceeded lines, want %d:\n%s", lines, len(want), buf.String())
	}
}
