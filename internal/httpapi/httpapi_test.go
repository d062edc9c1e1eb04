package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/engine"
)

// fakeEngine returns canned results, so the encoding of every kind of
// decision can be checked; the engine itself is tested end to end in
// internal/daemon.
type fakeEngine struct {
	mu     sync.Mutex
	calls  int
	checks []engine.Check
	result engine.Result
	batch  []engine.Result
	rules  []engine.RuleResult
	ready  error
	delay  time.Duration // how long Check takes
	begun  []int         // the checks of each request begun (Begin)
}

func (f *fakeEngine) Check(ctx context.Context, c *engine.Check) (engine.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.checks = append(f.checks, *c)
	time.Sleep(f.delay)
	return f.result, nil
}

func (f *fakeEngine) BatchCheckInto(ctx context.Context, checks []engine.Check, mode engine.BatchMode, a *engine.BatchAnswer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.checks = append(f.checks, checks...)
	a.Results = append(a.Results[:0], f.batch...)
	return nil
}

func (f *fakeEngine) Begin(ctx context.Context, n int, a *engine.BatchAnswer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begun = append(f.begun, n)
}

func (f *fakeEngine) Status(ctx context.Context, c *engine.Check) ([]engine.RuleResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checks = append(f.checks, *c)
	return f.rules, nil
}

func (f *fakeEngine) Ready(ctx context.Context) error { return f.ready }

var testNow = time.Unix(1_700_000_000, 0)

func newTestHandler(t *testing.T, f *fakeEngine) *Handler {
	t.Helper()
	h, err := New(Config{Engine: f, Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func do(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	h.ServeHTTP(rec, req)
	return rec
}

func allowedResult(limit, remaining int64) engine.Result {
	rr := engine.RuleResult{Rule: "per-client", Tier: "free", Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: 30 * time.Second, Cost: 1}
	return engine.Result{Allowed: true, Deciding: rr, Rules: []engine.RuleResult{rr}}
}

func deniedResult() engine.Result {
	rr := engine.RuleResult{Rule: "per-client", Tier: "free", Limit: 100, Remaining: 0, ResetAfter: 30 * time.Second, RetryAfter: 1500 * time.Millisecond}
	return engine.Result{Deciding: rr, Rules: []engine.RuleResult{rr}}
}

func TestCheckAllowed(t *testing.T) {
	f := &fakeEngine{result: allowedResult(100, 50)}
	rec := do(newTestHandler(t, f), "POST", "/api/v1/check", `{"client_id":"c1","resource":"/api/x","priority":"high"}`)
	if rec.Code != 200 {
		t.Fatalf("status = %d, want 200; body %s", rec.Code, rec.Body)
	}
	wantHdr := map[string]string{
		"X-RateLimit-Limit":           "100",
		"X-RateLimit-Remaining":       "50",
		"X-RateLimit-Reset":           "1700000030",
		"X-RateLimit-Policy":          "per-client",
		"X-RateLimit-Tier":            "free",
		"X-RateLimit-State":           "normal",
		"X-RateLimit-Decision-Source": "store",
		"RateLimit-Policy":            `"per-client";q=100`,
		"RateLimit":                   `"per-client";r=50;t=30`,
		"Retry-After":                 "",
		"X-RateLimit-Warning":         "",
		"Content-Type":                "application/json",
	}
	for k, want := range wantHdr {
		if got := rec.Header().Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	if body["allowed"] != true || body["remaining"] != 50.0 || body["reset_at"] != 1700000030.0 || body["rule"] != "per-client" || body["source"] != "store" {
		t.Errorf("body = %s", rec.Body)
	}
	if got := f.checks[0]; got.Cost != 1 || got.Priority != engine.PriorityHigh || got.ClientID != "c1" {
		t.Errorf("check = %+v, want cost 1, high priority, client c1", got)
	}
}

// TestCheckLatency: a check's answer says how long the engine took to decide
// it, in the X-RateLimit-Decision-Latency-Us header and the latency_us field
// (seed 002), rounded up to a microsecond, whatever decided it.
func TestCheckLatency(t *testing.T) {
	for _, res := range []engine.Result{allowedResult(100, 50), deniedResult(), {Allowed: true, Source: engine.SourceNoRule}} {
		f := &fakeEngine{result: res, delay: 3 * time.Millisecond}
		rec := do(newTestHandler(t, f), "POST", "/api/v1/check", `{"client_id":"c1"}`)
		hdr := rec.Header().Get("X-RateLimit-Decision-Latency-Us")
		var body struct {
			LatencyUS *int64 `json:"latency_us"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %s: %v", rec.Body, err)
		}
		if body.LatencyUS == nil {
			t.Fatalf("source %s: body %s has no latency_us", res.Source, rec.Body)
		}
		if got := *body.LatencyUS; got < 3000 || got > 3_000_000 {
			t.Errorf("source %s: latency_us = %d, want at least 3000 (the engine took 3ms)", res.Source, got)
		}
		if want := fmt.Sprint(*body.LatencyUS); hdr != want {
			t.Errorf("source %s: X-RateLimit-Decision-Latency-Us = %q, want %q as in the body", res.Source, hdr, want)
		}
	}
}

func TestCheckWarning(t *testing.T) {
	f := &fakeEngine{result: allowedResult(100, 15)}
	rec := do(newTestHandler(t, f), "POST", "/api/v1/check", `{"client_id":"c1","cost":0}`)
	if got, want := rec.Header().Get("X-RateLimit-State"), "warning"; got != want {
		t.Errorf("state = %q, want %q", got, want)
	}
	if got, want := rec.Header().Get("X-RateLimit-Warning"), "85% of the limit used"; got != want {
		t.Errorf("warning = %q, want %q", got, want)
	}
	if f.checks[0].Cost != 0 {
		t.Errorf("cost = %d, want 0", f.checks[0].Cost)
	}
}

func TestCheckDenied(t *testing.T) {
	f := &fakeEngine{result: deniedResult()}
	rec := do(newTestHandler(t, f), "POST", "/api/v1/check", `{"client_id":"c1"}`)
	if rec.Code != 429 {
		t.Fatalf("status = %d, want 429", rec.Code)
	}
	for k, want := range map[string]string{"Retry-After": "2", "Retry-After-Ms": "1500", "X-RateLimit-State": "throttled", "X-RateLimit-Remaining": "0"} {
		if got := rec.Header().Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	var body struct {
		Allowed          bool   `json:"allowed"`
		RetryAfter       int64  `json:"retry_after"`
		RetryAfterMS     int64  `json:"retry_after_ms"`
		Error            string `json:"error"`
		ErrorDescription string `json:"error_description"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Allowed || body.RetryAfter != 2 || body.RetryAfterMS != 1500 || body.Error != "rate_limit_exceeded" || !strings.Contains(body.ErrorDescription, "retry after 2 seconds") {
		t.Errorf("body = %s", rec.Body)
	}
}

func TestCheckUnavailableAndFailOpen(t *testing.T) {
	res := deniedResult()
	res.Unavailable = true
	res.Source = engine.SourceFailClosed
	f := &fakeEngine{result: res}
	h := newTestHandler(t, f)
	rec := do(h, "POST", "/api/v1/check", `{"client_id":"c1"}`)
	if rec.Code != 503 || rec.Header().Get("X-RateLimit-Decision-Source") != "fail_closed" || !strings.Contains(rec.Body.String(), `"error":"unavailable"`) {
		t.Errorf("fail closed: status %d, headers %v, body %s", rec.Code, rec.Header(), rec.Body)
	}
	f.result = allowedResult(10, 9)
	f.result.Source = engine.SourceFailOpen
	rec = do(h, "POST", "/api/v1/check", `{"client_id":"c1"}`)
	if rec.Code != 200 || rec.Header().Get("X-RateLimit-Decision-Source") != "fail_open" {
		t.Errorf("fail open: status %d, source %q", rec.Code, rec.Header().Get("X-RateLimit-Decision-Source"))
	}
}

func TestBadInput(t *testing.T) {
	long := strings.Repeat("a", MaxIdentifierBytes+1)
	tests := []struct {
		name, path, body string
		status           int
		field            string
	}{
		{"malformed", "/api/v1/check", `{"client_id":`, 400, "body"},
		{"not an object", "/api/v1/check", `[1,2]`, 400, "body"},
		{"empty", "/api/v1/check", ``, 400, "body"},
		{"trailing", "/api/v1/check", `{"client_id":"a"} {}`, 400, "body"},
		{"unknown field", "/api/v1/check", `{"client_id":"a","clientid":"b"}`, 400, "clientid"},
		{"batch item unknown field", "/api/v1/batch-check", `{"client_id":"a","checks":[{},{"usr":"b"}]}`, 400, "checks[1].usr"},
		{"missing client_id", "/api/v1/check", `{"resource":"/x"}`, 400, "client_id"},
		{"negative cost", "/api/v1/check", `{"client_id":"a","cost":-1}`, 400, "cost"},
		{"huge cost", "/api/v1/check", `{"client_id":"a","cost":1073741825}`, 400, "cost"},
		{"overflowing cost", "/api/v1/check", `{"client_id":"a","cost":1e30}`, 400, "cost"},
		{"fractional cost", "/api/v1/check", `{"client_id":"a","cost":1.5}`, 400, "cost"},
		{"string cost", "/api/v1/check", `{"client_id":"a","cost":"1"}`, 400, "cost"},
		{"unknown priority", "/api/v1/check", `{"client_id":"a","priority":"urgent"}`, 400, "priority"},
		{"long identifier", "/api/v1/check", `{"client_id":"a","user":"` + long + `"}`, 400, "user"},
		{"control character", "/api/v1/check", `{"client_id":"a\u0001"}`, 400, "client_id"},
		{"invalid utf-8", "/api/v1/check", "{\"client_id\":\"a\",\"resource\":\"/\xff\"}", 400, "resource"},
		{"too large", "/api/v1/check", `{"client_id":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, 413, "body"},
		{"unknown mode", "/api/v1/batch-check", `{"client_id":"a","mode":"some","checks":[{"resource":"x"}]}`, 400, "mode"},
		{"no checks", "/api/v1/batch-check", `{"client_id":"a","checks":[]}`, 400, "checks"},
		{"batch bad cost", "/api/v1/batch-check", `{"client_id":"a","checks":[{"resource":"x"},{"cost":-3}]}`, 400, "checks[1].cost"},
		{"batch no client", "/api/v1/batch-check", `{"checks":[{"resource":"x"}]}`, 400, "checks[0].client_id"},
		{"batch item without client", "/api/v1/batch-check", `{"checks":[{"client_id":"a"},{"cost":1}]}`, 400, "checks[1].client_id"},
		{"batch item fractional cost", "/api/v1/batch-check", `{"client_id":"a","checks":[{},{"cost":1.5}]}`, 400, "checks[1].cost"},
		{"batch item overflowing cost", "/api/v1/batch-check", `{"client_id":"a","checks":[{}, {"cost": 99999999999999999999 }]}`, 400, "checks[1].cost"},
		{"batch item user of the wrong type", "/api/v1/batch-check", `{"client_id":"a","checks":[{},{"user":5}]}`, 400, "checks[1].user"},
		{"batch item user an object", "/api/v1/batch-check", `{"client_id":"a","checks":[{},{},{"user":{"a":[1,2]}}]}`, 400, "checks[2].user"},
		{"batch item not an object", "/api/v1/batch-check", `{"client_id":"a","checks":[{},1]}`, 400, "checks[1]"},
		{"batch item null", "/api/v1/batch-check", `{"client_id":"a","checks":[{}, null]}`, 400, "checks[1]"},
		{"batch checks not a list", "/api/v1/batch-check", `{"client_id":"a","checks":5}`, 400, "checks"},
		{"too many checks", "/api/v1/batch-check", `{"client_id":"a","checks":[` + strings.Repeat(`{},`, MaxBatch) + `{}]}`, 400, "checks"},
		{"long resource", "/api/v1/check", `{"client_id":"a","resource":"/` + strings.Repeat("r", MaxResourceBytes) + `"}`, 400, "resource"},
		{"long client_id", "/api/v1/check", `{"client_id":"` + long + `"}`, 400, "client_id"},
		{"long idempotency_key", "/api/v1/check", `{"client_id":"a","idempotency_key":"` + long + `"}`, 400, "idempotency_key"},
		{"null cost", "/api/v1/check", `{"client_id":"a","cost":null,"priority":"low","mode":"x"}`, 400, "mode"},
		{"invalid utf-8 in a key", "/api/v1/check", "{\"client_id\":\"a\",\"us\xffer\":\"u\"}", 400, "body"},
		{"invalid utf-8 in a batch item", "/api/v1/batch-check", "{\"client_id\":\"a\",\"checks\":[{\"resource\":\"x\"},{\"resource\":\"y\",\"user\":\"\xff\"}]}", 400, "checks[1].user"},
		{"invalid utf-8 in the batch", "/api/v1/batch-check", "{\"checks\":[{\"resource\":[\"x\"]}],\"client_id\":\"\xc3\"}", 400, "client_id"},
		// The batch's own identity fields are refused even where every
		// check has its own.
		{"batch long user", "/api/v1/batch-check", `{"client_id":"a","user":"` + long + `","checks":[{"user":"u"}]}`, 400, "user"},
		{"batch control character in client_id", "/api/v1/batch-check", `{"client_id":"a\u0001","checks":[{"client_id":"b"}]}`, 400, "client_id"},
		{"batch unknown priority", "/api/v1/batch-check", `{"client_id":"a","priority":"urgent","checks":[{"resource":"x"}]}`, 400, "priority"},
		{"batch item unknown priority", "/api/v1/batch-check", `{"client_id":"a","checks":[{"resource":"x","priority":"now"}]}`, 400, "checks[0].priority"},
		{"batch mode of the wrong type", "/api/v1/batch-check", `{"client_id":"a","mode":1,"checks":[{"resource":"x"}]}`, 400, "mode"},
		{"batch item long user", "/api/v1/batch-check", `{"client_id":"a","checks":[{"user":"` + long + `"}]}`, 400, "checks[0].user"},
		// encoding/json takes the last of repeated keys and matches keys
		// regardless of case; a proxy in front may read the first, or
		// only the exact name.
		{"repeated client_id", "/api/v1/check", `{"client_id":"a","client_id":"b"}`, 400, "client_id"},
		{"repeated cost", "/api/v1/check", `{"client_id":"a","cost":0,"resource":"/x","cost":5}`, 400, "cost"},
		{"repeated under another case", "/api/v1/check", `{"client_id":"a","CLIENT_ID":"b"}`, 400, "CLIENT_ID"},
		{"repeated with an escape", "/api/v1/check", `{"client_id":"a","client\u005fid":"b"}`, 400, "client_id"},
		{"another case", "/api/v1/check", `{"Client_ID":"a"}`, 400, "Client_ID"},
		{"batch repeated mode", "/api/v1/batch-check", `{"client_id":"a","mode":"best_effort","mode":"all_or_nothing","checks":[{}]}`, 400, "mode"},
		{"batch item repeated cost", "/api/v1/batch-check", `{"client_id":"a","checks":[{"cost":1},{"cost":1,"cost":2}]}`, 400, "checks[1].cost"},
		{"batch item another case", "/api/v1/batch-check", `{"client_id":"a","checks":[{"Cost":1}]}`, 400, "checks[0].Cost"},
		{"batch repeated checks", "/api/v1/batch-check", `{"client_id":"a","checks":[{}],"checks":[{}]}`, 400, "checks"},
		{"batch too large", "/api/v1/batch-check", `{"client_id":"a","checks":[{"resource":"` + strings.Repeat("a", MaxBodyBytes) + `"}]}`, 413, "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeEngine{result: allowedResult(1, 1)}
			rec := do(newTestHandler(t, f), "POST", tt.path, tt.body)
			if rec.Code != tt.status {
				t.Errorf("status = %d, want %d; body %s", rec.Code, tt.status, rec.Body)
			}
			var body struct{ Error, Field, ErrorDescription string }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if body.Field != tt.field {
				t.Errorf("field = %q, want %q (body %s)", body.Field, tt.field, rec.Body)
			}
			if f.calls != 0 {
				t.Errorf("engine called %d times on bad input, want 0", f.calls)
			}
		})
	}
}

// TestBadInputElsewhere covers bad input that the JSON body does not carry:
// the X-Idempotency-Key header, the status endpoint's path and query, and
// an oversized body sent without a Content-Length.
func TestBadInputElsewhere(t *testing.T) {
	long := strings.Repeat("a", MaxIdentifierBytes+1)
	tests := []struct {
		name   string
		req    func() *http.Request
		status int
		field  string
	}{
		{"long idempotency header", func() *http.Request {
			r := httptest.NewRequest("POST", "/api/v1/check", strings.NewReader(`{"client_id":"a"}`))
			r.Header.Set("X-Idempotency-Key", long)
			return r
		}, 400, "idempotency_key"},
		{"control character in idempotency header", func() *http.Request {
			r := httptest.NewRequest("POST", "/api/v1/check", strings.NewReader(`{"client_id":"a"}`))
			r.Header.Set("X-Idempotency-Key", "a\x01b")
			return r
		}, 400, "idempotency_key"},
		{"status: long client_id", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/"+long, nil)
		}, 400, "client_id"},
		{"status: long resource", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?resource=/"+strings.Repeat("r", MaxResourceBytes), nil)
		}, 400, "resource"},
		{"status: invalid utf-8 user", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?user=%FF", nil)
		}, 400, "user"},
		{"status: invalid utf-8 client_id", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/%C3", nil)
		}, 400, "client_id"},
		// A query the server cannot read, or reads two ways, must not be
		// answered as if the parameter were absent.
		{"status: semicolon in a value", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?resource=/api/x;v=1", nil)
		}, 400, "resource"},
		{"status: bad escape", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?resource=/api/x&user=%zz", nil)
		}, 400, "user"},
		{"status: bad escape in a name", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?us%zzer=u", nil)
		}, 400, "query"},
		{"status: repeated parameter", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?user=u1&user=u2", nil)
		}, 400, "user"},
		{"status: unknown parameter", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?resourse=/api/x", nil)
		}, 400, "resourse"},
		{"status: control character in a value", func() *http.Request {
			return httptest.NewRequest("GET", "/api/v1/status/a?ip=1.2.3.4%0A", nil)
		}, 400, "ip"},
		{"chunked body over the limit", func() *http.Request {
			body := `{"client_id":"a","user":"` + strings.Repeat("u", MaxBodyBytes) + `"}`
			r := httptest.NewRequest("POST", "/api/v1/check", io.MultiReader(strings.NewReader(body)))
			r.ContentLength = -1
			return r
		}, 413, "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeEngine{result: allowedResult(1, 1)}
			rec := httptest.NewRecorder()
			newTestHandler(t, f).ServeHTTP(rec, tt.req())
			var body struct{ Error, Field string }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != tt.status || body.Field != tt.field {
				t.Errorf("got %d naming %q, want %d naming %q; body %s", rec.Code, body.Field, tt.status, tt.field, rec.Body)
			}
			if f.calls != 0 || len(f.checks) != 0 {
				t.Errorf("engine called on bad input: %d calls, %d checks", f.calls, len(f.checks))
			}
		})
	}
}

// TestBodyAtTheLimit checks that a body of exactly MaxBodyBytes is read,
// not refused as too large.
func TestBodyAtTheLimit(t *testing.T) {
	prefix := `{"client_id":"a"}`
	body := prefix + strings.Repeat(" ", MaxBodyBytes-len(prefix))
	f := &fakeEngine{result: allowedResult(1, 1)}
	if rec := do(newTestHandler(t, f), "POST", "/api/v1/check", body); rec.Code != 200 {
		t.Errorf("a %d-byte body: %d %s, want 200", len(body), rec.Code, rec.Body)
	}
}

// TestBatchBegunBeforeDecoding: a batch is begun with the engine, its
// checks counted by their braces (a brace in a string counts too: the
// count is never below the checks), before its body is decoded, so that a
// large one waits its turn first; a body that does not decode too.
func TestBatchBegunBeforeDecoding(t *testing.T) {
	checks := func(resource string) string {
		return strings.TrimSuffix(strings.Repeat(`{"resource":"`+resource+`"},`, 20), ",")
	}
	f := &fakeEngine{batch: make([]engine.Result, 20)}
	h := newTestHandler(t, f)
	for _, body := range []string{
		`{"client_id":"c","checks":[` + checks("/a") + `]}`,
		`{"client_id":"c","checks":[` + checks("/a/{id}") + `]}`,
	} {
		if rec := do(h, "POST", "/api/v1/batch-check", body); rec.Code == http.StatusBadRequest {
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
	}
	if rec := do(h, "POST", "/api/v1/batch-check", `{"client_id":"c","checks":[`+checks("/a")+`,{"cost":-1}]}`); rec.Code != http.StatusBadRequest {
		t.Fatalf("a bad check: %d, want 400", rec.Code)
	}
	if want := []int{20, 40, 21}; !slices.Equal(f.begun, want) {
		t.Errorf("requests begun with %v checks, want %v", f.begun, want)
	}
}

func TestBatchStatuses(t *testing.T) {
	allow, deny := allowedResult(10, 5), deniedResult()
	tests := []struct {
		name    string
		mode    string
		results []engine.Result
		status  int
		partial bool
	}{
		{"all allowed", "all_or_nothing", []engine.Result{allow, allow}, 200, false},
		{"all or nothing denied", "all_or_nothing", []engine.Result{deny, deny}, 429, false},
		{"best effort mixed", "best_effort", []engine.Result{allow, deny}, 207, true},
		{"best effort all allowed", "best_effort", []engine.Result{allow, allow}, 200, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeEngine{batch: tt.results}
			rec := do(newTestHandler(t, f), "POST", "/api/v1/batch-check",
				`{"client_id":"c","user":"u","mode":"`+tt.mode+`","checks":[{"resource":"api"},{"resource":"compute","cost":5,"user":"v"}]}`)
			if rec.Code != tt.status {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tt.status, rec.Body)
			}
			var body struct {
				Partial bool
				Results []struct {
					Resource string
					Status   int
					Allowed  bool
				}
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Partial != tt.partial || len(body.Results) != 2 || body.Results[1].Resource != "compute" {
				t.Errorf("body = %s", rec.Body)
			}
			if f.checks[0].User != "u" || f.checks[1].User != "v" || f.checks[1].Cost != 5 || f.checks[0].ClientID != "c" {
				t.Errorf("checks = %+v, want inherited identity", f.checks)
			}
		})
	}
}

func TestStatusConsumesNothing(t *testing.T) {
	f := &fakeEngine{rules: []engine.RuleResult{{Rule: "r1", Limit: 10, Remaining: 7}}}
	rec := do(newTestHandler(t, f), "GET", "/api/v1/status/c1?resource=/api/x&user=u", "")
	if rec.Code != 200 {
		t.Fatalf("status = %d, body %s", rec.Code, rec.Body)
	}
	if got := f.checks[0]; got.Cost != 0 || got.ClientID != "c1" || got.Resource != "/api/x" || got.User != "u" {
		t.Errorf("check = %+v", got)
	}
	if !strings.Contains(rec.Body.String(), `"limits":[{"rule":"r1"`) {
		t.Errorf("body = %s", rec.Body)
	}
}

// TestStatusSpecParameters: the status endpoint takes include_global,
// include_predictions and include_history. The figures are those of the
// store every instance shares, so include_global answers the same either
// way; Sluice keeps no predictions, and without analytics no history, so
// asking for them is refused, naming the parameter, rather than answered
// without them.
func TestStatusSpecParameters(t *testing.T) {
	tests := []struct {
		query  string
		status int
		field  string
		desc   string
	}{
		{"include_global=true", 200, "", ""},
		{"include_global=false", 200, "", ""},
		{"include_global=true&include_predictions=false&include_history=false", 200, "", ""},
		{"include_global=yes", 400, "include_global", "want true or false"},
		{"include_global=true&include_global=false", 400, "include_global", "given more than once"},
		{"include_predictions=true", 400, "include_predictions", "not supported"},
		{"include_history=true", 400, "include_history", "not served"},
	}
	for _, tt := range tests {
		f := &fakeEngine{rules: []engine.RuleResult{{Rule: "r1", Allowed: true, Limit: 10, Remaining: 7}}}
		rec := do(newTestHandler(t, f), "GET", "/api/v1/status/c1?resource=/api/x&"+tt.query, "")
		if rec.Code != tt.status {
			t.Errorf("%s: status %d, want %d; body %s", tt.query, rec.Code, tt.status, rec.Body)
			continue
		}
		if tt.status == 200 {
			if len(f.checks) != 1 || f.checks[0].Resource != "/api/x" || !strings.Contains(rec.Body.String(), `"rule":"r1"`) {
				t.Errorf("%s: checks %+v, body %s", tt.query, f.checks, rec.Body)
			}
			continue
		}
		var body struct {
			Field string `json:"field"`
			Desc  string `json:"error_description"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: body %s: %v", tt.query, rec.Body, err)
		}
		if body.Field != tt.field || !strings.Contains(body.Desc, tt.desc) {
			t.Errorf("%s: field %q, description %q; want %q, containing %q", tt.query, body.Field, body.Desc, tt.field, tt.desc)
		}
		if len(f.checks) != 0 {
			t.Errorf("%s: engine called on bad input", tt.query)
		}
	}
}

func TestHealthReadyNotFound(t *testing.T) {
	f := &fakeEngine{}
	h, err := New(Config{Engine: f, ConfigStatus: func() ConfigStatus {
		return ConfigStatus{Version: "v1", LastError: "bad.yaml:3: boom"}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if rec := do(h, "GET", "/healthz", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"status":"ok"`) ||
		!strings.Contains(rec.Body.String(), `"version":`) || !strings.Contains(rec.Body.String(), `"commit":`) {
		t.Errorf("healthz = %d %s, want 200 with the status and the build", rec.Code, rec.Body)
	}
	rec := do(h, "GET", "/readyz", "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"last_error":"bad.yaml:3: boom"`) {
		t.Errorf("readyz = %d %s", rec.Code, rec.Body)
	}
	f.ready = context.DeadlineExceeded
	if rec := do(h, "GET", "/readyz", ""); rec.Code != 503 {
		t.Errorf("readyz with the store down = %d, want 503", rec.Code)
	}
	hb, err := New(Config{Engine: f, Breaker: func() string { return "open" }})
	if err != nil {
		t.Fatal(err)
	}
	if rec := do(hb, "GET", "/readyz", ""); rec.Code != 503 || !strings.Contains(rec.Body.String(), `"breaker":"open"`) {
		t.Errorf("readyz with the breaker open = %d %s", rec.Code, rec.Body)
	}
	for _, tt := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/nope", 404, "not_found", ""},
		{"POST", "/", 404, "not_found", ""},
		{"GET", "/metrics", 404, "not_found", ""}, // no metrics handler
		{"GET", "/api/v1/check", 405, "method_not_allowed", "POST"},
		{"DELETE", "/api/v1/status/c1", 405, "method_not_allowed", "GET, HEAD"},
		{"POST", "/healthz", 405, "method_not_allowed", "GET, HEAD"},
		{"HEAD", "/healthz", 200, "", ""},
	} {
		rec := do(h, tt.method, tt.path, "")
		var body struct{ Error string }
		if tt.code != "" {
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Errorf("%s %s: body %q is not JSON: %v", tt.method, tt.path, rec.Body, err)
			}
		}
		if rec.Code != tt.status || body.Error != tt.code || rec.Header().Get("Allow") != tt.allow {
			t.Errorf("%s %s = %d %q, Allow %q; want %d %q, Allow %q", tt.method, tt.path, rec.Code, body.Error, rec.Header().Get("Allow"), tt.status, tt.code, tt.allow)
		}
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "abc", "a\"b\\c", "\n\t\x00", "<&>", "é日本", "\u2028", "bad\xffutf8"} {
		got := string(appendString(nil, s))
		var back string
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Errorf("appendString(%q) = %s: %v", s, got, err)
			continue
		}
		want := strings.ToValidUTF8(s, "\ufffd")
		if back != want {
			t.Errorf("round trip of %q = %q, want %q", s, back, want)
		}
	}
}

// FuzzDecodeCheck feeds arbitrary bodies to the check decoder: it must
// never panic, and what it accepts must be a valid check that encoding/json
// reads the same way.
func FuzzDecodeCheck(f *testing.F) {
	for _, s := range []string{
		`{"client_id":"c","resource":"/a","cost":3,"priority":"low"}`,
		`{"client_id":"c","cost":0,"idempotency_key":"k"}`,
		`{"client_id":"\u00e9","user":"u","ip":"1.2.3.4","api_key":"k","method":"GET","operation":"read"}`,
		`{"client_id":1}`, `{"cost":-1}`, "{\"client_id\":\"\xff\"}", `[]`, `null`, `{"client_id":"a"}x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c engine.Check
		_, err := decodeCheck(data, &c)
		if err != nil {
			if _, code := statusOf(err); code != "invalid_request" {
				t.Fatalf("error %v maps to %s, want invalid_request", err, code)
			}
			return
		}
		if c.ClientID == "" || c.Cost < 0 || c.Cost > MaxCost {
			t.Fatalf("accepted %q as %+v", data, c)
		}
		if len(c.Resource) > MaxResourceBytes || !utf8.ValidString(c.Resource) {
			t.Fatalf("accepted resource %q", c.Resource)
		}
		for _, s := range []string{c.ClientID, c.User, c.IP, c.APIKey, c.Method, c.Operation, c.IdempotencyKey} {
			if len(s) > MaxIdentifierBytes || !utf8.ValidString(s) {
				t.Fatalf("accepted identifier %q", s)
			}
		}
		for _, s := range []string{c.ClientID, c.User, c.IP, c.APIKey, c.Method, c.Operation, c.IdempotencyKey, c.Resource} {
			if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
				t.Fatalf("accepted a control character in %q", s)
			}
		}
		if msg := oddKeys(data); msg != "" {
			t.Fatalf("accepted %q: %s", data, msg)
		}
		var cr checkRequest
		if err := json.Unmarshal(data, &cr); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", data, err)
		}
		var want engine.Check
		if err := cr.toCheck(&want); err != nil || want != c {
			t.Fatalf("decoded %+v, encoding/json %+v (%v)", c, want, err)
		}
	})
}

// FuzzDecodeBatch feeds arbitrary bodies to the batch decoder: it must
// never panic, refuse with invalid_request, and what it accepts must be
// 1 to MaxBatch valid checks, with no key repeated or misspelled, that
// encoding/json reads the same way.
func FuzzDecodeBatch(f *testing.F) {
	for _, s := range []string{
		`{"client_id":"c","mode":"best_effort","checks":[{"resource":"/a","cost":3},{"client_id":"d","user":"u"}]}`,
		`{"user":"u","priority":"low","checks":[{"client_id":"c","priority":"high"}]}`,
		`{"client_id":"c","checks":[{},{"cost":1,"cost":2}]}`, `{"client_id":"c","checks":[{"Cost":1}]}`,
		`{"client_id":"c","checks":[null]}`, `{"checks":[]}`, `{"client_id":"c","checks":[{"user":"\u0000"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checks, mode, err := decodeBatch(data, new(batchMem))
		if err != nil {
			if _, code := statusOf(err); code != "invalid_request" {
				t.Fatalf("error %v maps to %s, want invalid_request", err, code)
			}
			return
		}
		if len(checks) == 0 || len(checks) > MaxBatch || (mode != engine.AllOrNothing && mode != engine.BestEffort) {
			t.Fatalf("accepted %q as %d checks, mode %v", data, len(checks), mode)
		}
		if msg := oddKeys(data); msg != "" {
			t.Fatalf("accepted %q: %s", data, msg)
		}
		var br batchRequest
		if err := json.Unmarshal(data, &br); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", data, err)
		}
		for i, c := range checks {
			if c.ClientID == "" || c.Cost < 0 || c.Cost > MaxCost || len(c.Resource) > MaxResourceBytes {
				t.Fatalf("accepted check %d of %q as %+v", i, data, c)
			}
			for _, s := range []string{c.ClientID, c.User, c.IP, c.APIKey, c.Method, c.Operation, c.IdempotencyKey} {
				if len(s) > MaxIdentifierBytes || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
					t.Fatalf("accepted identifier %q in check %d", s, i)
				}
			}
			if c.ClientID != or(br.Checks[i].ClientID, br.ClientID) || c.User != or(br.Checks[i].User, br.User) {
				t.Fatalf("check %d: %+v, encoding/json %+v in %+v", i, c, br.Checks[i], br)
			}
		}
	})
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// oddKeys returns what is wrong with the object keys of the JSON document
// data for a request: a key repeated in its object, or one that is not
// exactly a field name; "" when nothing is.
func oddKeys(data []byte) string {
	fields := map[string]bool{}
	for _, typ := range []reflect.Type{reflect.TypeFor[checkRequest](), reflect.TypeFor[batchRequest]()} {
		for i := range typ.NumField() {
			fields[strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]] = true
		}
	}
	type frame struct {
		obj, wantKey bool
		keys         map[string]bool
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			if key, ok := tok.(string); ok {
				f := stack[n-1]
				switch {
				case !fields[key]:
					return fmt.Sprintf("key %q is no field", key)
				case f.keys[key]:
					return fmt.Sprintf("key %q repeated", key)
				}
				f.keys[key], f.wantKey = true, false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, wantKey: true, keys: map[string]bool{}})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	f := &fakeEngine{result: allowedResult(100, 50)}
	h, err := New(Config{Engine: benchEngine{f.result}})
	if err != nil {
		b.Fatal(err)
	}
	body := `{"client_id":"client-1","resource":"/api/v1/orders","operation":"read"}`
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/api/v1/check", strings.NewReader(body))
		h.ServeHTTP(rec, req)
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}

// benchEngine answers every check with one result, without locking.
type benchEngine struct{ res engine.Result }

func (e benchEngine) Check(ctx context.Context, c *engine.Check) (engine.Result, error) {
	return e.res, nil
}
func (e benchEngine) BatchCheckInto(ctx context.Context, checks []engine.Check, mode engine.BatchMode, a *engine.BatchAnswer) error {
	return nil
}
func (e benchEngine) Begin(ctx context.Context, n int, a *engine.BatchAnswer) {}
func (e benchEngine) Status(ctx context.Context, c *engine.Check) ([]engine.RuleResult, error) {
	return nil, nil
}
func (e benchEngine) Ready(ctx context.Context) error { return nil }

// TestDeniedWithBatch: a denied check whose own rules all admitted it, or
// to which no rule applies, was denied by another check of its
// all_or_nothing batch.
func TestDeniedWithBatch(t *testing.T) {
	admitted := engine.RuleResult{Rule: "r", Allowed: true, Limit: 10, Remaining: 9}
	for _, tc := range []struct {
		name string
		res  engine.Result
		want bool
	}{
		{"its own rule denied it", deniedResult(), false},
		{"its rules admitted it", engine.Result{Rules: []engine.RuleResult{admitted}}, true},
		{"no rule applies to it", engine.Result{}, true},
		{"another check's identity is deny-listed", engine.Result{Source: engine.SourceDenyList}, true},
		{"allowed", engine.Result{Allowed: true}, false},
	} {
		if got := deniedWithBatch(&tc.res); got != tc.want {
			t.Errorf("%s: deniedWithBatch = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDecodeBatchReused: a batch decoded into the memory of a larger one
// before it has none of its fields.
func TestDecodeBatchReused(t *testing.T) {
	m := new(batchMem)
	first := `{"client_id":"c","user":"u","checks":[{"resource":"/a","cost":3,"ip":"1.2.3.4","idempotency_key":"k"},{"resource":"/b","operation":"write","api_key":"a"},{"method":"GET"}]}`
	if _, _, err := decodeBatch([]byte(first), m); err != nil {
		t.Fatal(err)
	}
	m.reset()
	checks, mode, err := decodeBatch([]byte(`{"mode":"best_effort","checks":[{"client_id":"d"},{"client_id":"e","cost":0}]}`), m)
	if err != nil {
		t.Fatal(err)
	}
	want := []engine.Check{{ClientID: "d", Cost: 1}, {ClientID: "e"}}
	if mode != engine.BestEffort || !reflect.DeepEqual(checks, want) {
		t.Errorf("got %v, %+v; want best effort, %+v", mode, checks, want)
	}
}

func BenchmarkDecodeBatch(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"client_id":"client-1","mode":"best_effort","checks":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"resource":"/api/v1/orders","operation":"read","cost":2,"user":"u1"}`)
	}
	sb.WriteString(`]}`)
	data := []byte(sb.String())
	b.ReportAllocs()
	for b.Loop() {
		m := getBatchMem()
		if _, _, err := decodeBatch(data, m); err != nil {
			b.Fatal(err)
		}
		putBatchMem(m)
	}
}

func TestThrottleInAnswers(t *testing.T) {
	res := allowedResult(5, 4)
	res.ThrottlePercent = 50
	res.Deciding.ThrottlePercent = 50
	res.Rules[0].ThrottlePercent = 50
	f := &fakeEngine{result: res, batch: []engine.Result{res}, rules: res.Rules}
	h := newTestHandler(t, f)
	rec := do(h, "POST", "/api/v1/check", `{"client_id":"c","resource":"/api/x"}`)
	if got := rec.Header().Get("X-RateLimit-Throttle"); got != "50" {
		t.Errorf("X-RateLimit-Throttle = %q, want 50", got)
	}
	if body := rec.Body.String(); strings.Count(body, `"throttle_percent":50`) != 2 {
		t.Errorf("check body %s: want throttle_percent 50 on the answer and its rule", body)
	}
	rec = do(h, "GET", "/api/v1/status/c?resource=/api/x", "")
	if body := rec.Body.String(); !strings.Contains(body, `"throttle_percent":50`) {
		t.Errorf("status body %s: want throttle_percent 50", body)
	}
	f.result = allowedResult(5, 4)
	rec = do(h, "POST", "/api/v1/check", `{"client_id":"c","resource":"/api/x"}`)
	if rec.Header().Get("X-RateLimit-Throttle") != "" || strings.Contains(rec.Body.String(), "throttle") {
		t.Errorf("unthrottled answer mentions a throttle: %s", rec.Body.String())
	}
}

// TestStatusHistory: include_history=true adds the client's last 24 hours
// to the answer, which is otherwise unchanged.
func TestStatusHistory(t *testing.T) {
	var asked []string
	h, err := New(Config{Engine: &fakeEngine{rules: []engine.RuleResult{{Rule: "r1", Allowed: true, Limit: 10, Remaining: 7}}},
		Now: func() time.Time { return testNow },
		History: func(_ context.Context, client string, now time.Time) (History, error) {
			asked = append(asked, client+"@"+now.Format(time.RFC3339))
			return History{Requests: 12, Blocked: 3, AvgLatencyUS: 41.25}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	plain := do(h, "GET", "/api/v1/status/c1?resource=/api/x", "")
	with := do(h, "GET", "/api/v1/status/c1?resource=/api/x&include_history=true", "")
	off := do(h, "GET", "/api/v1/status/c1?resource=/api/x&include_history=false", "")
	if plain.Code != 200 || with.Code != 200 || off.Body.String() != plain.Body.String() {
		t.Fatalf("statuses %d, %d; without history %s, with false %s", plain.Code, with.Code, plain.Body, off.Body)
	}
	want := strings.TrimSuffix(strings.TrimSpace(plain.Body.String()), "}") +
		`,"last_24h_requests":12,"last_24h_blocked":3,"average_latency_us":41.2}`
	if got := strings.TrimSpace(with.Body.String()); got != want {
		t.Errorf("with history:\n got %s\nwant %s", got, want)
	}
	if len(asked) != 1 || asked[0] != "c1@"+testNow.Format(time.RFC3339) {
		t.Errorf("history asked for %v", asked)
	}
	failing, _ := New(Config{Engine: &fakeEngine{}, History: func(context.Context, string, time.Time) (History, error) {
		return History{}, errors.New("postgres://u:secret@db down")
	}})
	rec := do(failing, "GET", "/api/v1/status/c1?include_history=true", "")
	if rec.Code != 503 || strings.Contains(rec.Body.String(), "secret") {
		t.Errorf("history failing: %d %s", rec.Code, rec.Body)
	}
}
