package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
)

// newReserveHandler returns a handler with a real Keeper over a pool of
// 100 tokens for /api/*, its clock, and the engine behind it.
func newReserveHandler(t *testing.T) (*Handler, *atomic.Int64, *fakeEngine) {
	t.Helper()
	p, err := policy.Parse("t.yaml", []byte("version: 1\nrules:\n  - {id: api, match: {resource: \"/api/*\"}, limit: 100, window: 1m, algorithm: fixed_window}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var us atomic.Int64
	us.Store(testNow.UnixMicro())
	now := func() time.Time { return time.UnixMicro(us.Load()) }
	k, err := reserve.New(reserve.Config{Policy: func() *policy.Policy { return p }, Now: now, QueueLimit: 1, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	f := &fakeEngine{result: allowedResult(100, 50)}
	h, err := New(Config{Engine: f, Now: now, Reservations: k})
	if err != nil {
		t.Fatal(err)
	}
	return h, &us, f
}

func decodeBody(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	return m
}

func TestReserveRoutes(t *testing.T) {
	h, us, f := newReserveHandler(t)
	rec := do(h, "POST", "/api/v1/reserve", `{"client_id":"a","resource":"/api/x","tokens_needed":60,"duration_seconds":60,"priority":"high"}`)
	if rec.Code != 200 {
		t.Fatalf("reserve: %d %s", rec.Code, rec.Body)
	}
	a := decodeBody(t, rec)
	if a["tokens_reserved"] != 60.0 || a["position_in_queue"] != 0.0 || a["expires_at"] != "2023-11-14T22:14:20Z" {
		t.Errorf("granted body %s", rec.Body)
	}
	id := a["reservation_id"].(string)
	rec = do(h, "POST", "/api/v1/reserve", `{"client_id":"b","resource":"/api/x","tokens_needed":50,"duration_seconds":10}`)
	if rec.Code != 202 {
		t.Fatalf("queued: %d %s", rec.Code, rec.Body)
	}
	q := decodeBody(t, rec)
	if q["status"] != "queued" || q["position_in_queue"] != 1.0 || q["estimated_grant_at"] == nil {
		t.Errorf("queued body %s", rec.Body)
	}
	rec = do(h, "POST", "/api/v1/reserve", `{"client_id":"c","resource":"/api/x","tokens_needed":1,"duration_seconds":10}`)
	if rec.Code != 429 || decodeBody(t, rec)["error"] != "queue_full" {
		t.Errorf("queue full: %d %s", rec.Code, rec.Body)
	}

	// A check with the reservation draws from it, not from the engine.
	rec = do(h, "POST", "/api/v1/check", `{"client_id":"a","resource":"/api/x","cost":10,"reservation_id":"`+id+`"}`)
	if rec.Code != 200 || decodeBody(t, rec)["remaining"] != 50.0 || f.calls != 0 {
		t.Errorf("check with reservation: %d %s, engine calls %d", rec.Code, rec.Body, f.calls)
	}
	rec = do(h, "POST", "/api/v1/check", `{"client_id":"b","cost":1,"reservation_id":"`+id+`"}`)
	if rec.Code != 403 {
		t.Errorf("another client's reservation: %d %s", rec.Code, rec.Body)
	}
	// Above the balance, the limit decides.
	rec = do(h, "POST", "/api/v1/check", `{"client_id":"a","cost":51,"reservation_id":"`+id+`"}`)
	if rec.Code != 200 || f.calls != 1 {
		t.Errorf("check above the balance: %d %s, engine calls %d", rec.Code, rec.Body, f.calls)
	}

	rec = do(h, "GET", "/api/v1/reserve/"+id, "")
	if g := decodeBody(t, rec); rec.Code != 200 || g["status"] != "granted" || g["tokens_remaining"] != 50.0 || g["tokens_used"] != 10.0 {
		t.Errorf("get: %d %s", rec.Code, rec.Body)
	}
	if rec = do(h, "GET", "/api/v1/reserve/"+id+"?client_id=b", ""); rec.Code != 403 {
		t.Errorf("get by another client: %d %s", rec.Code, rec.Body)
	}
	if rec = do(h, "DELETE", "/api/v1/reserve/"+id+"?client_id=b", ""); rec.Code != 403 {
		t.Errorf("release by another client: %d %s", rec.Code, rec.Body)
	}
	rec = do(h, "DELETE", "/api/v1/reserve/"+id, "")
	if d := decodeBody(t, rec); rec.Code != 200 || d["status"] != "released" || d["tokens_returned"] != 50.0 {
		t.Errorf("release: %d %s", rec.Code, rec.Body)
	}
	if rec = do(h, "DELETE", "/api/v1/reserve/"+id, ""); rec.Code != 404 || decodeBody(t, rec)["error"] != "reservation_not_found" {
		t.Errorf("second release: %d %s", rec.Code, rec.Body)
	}
	if rec = do(h, "GET", "/api/v1/reserve/"+id, ""); rec.Code != 404 {
		t.Errorf("get after release: %d %s", rec.Code, rec.Body)
	}
	// b was granted by the release; cancel nothing, release it.
	bid := q["reservation_id"].(string)
	if rec = do(h, "GET", "/api/v1/reserve/"+bid, ""); decodeBody(t, rec)["status"] != "granted" {
		t.Errorf("b after the release: %s", rec.Body)
	}
	us.Add((11 * time.Second).Microseconds())
	if rec = do(h, "DELETE", "/api/v1/reserve/"+bid, ""); rec.Code != 404 {
		t.Errorf("release after expiry: %d %s", rec.Code, rec.Body)
	}
	if rec = do(h, "PUT", "/api/v1/reserve/"+bid, ""); rec.Code != 405 || rec.Header().Get("Allow") != "GET, HEAD, DELETE" {
		t.Errorf("PUT: %d %s %q", rec.Code, rec.Body, rec.Header().Get("Allow"))
	}
}

func TestReserveCancel(t *testing.T) {
	h, _, _ := newReserveHandler(t)
	do(h, "POST", "/api/v1/reserve", `{"client_id":"a","resource":"/api/x","tokens_needed":100,"duration_seconds":60}`)
	rec := do(h, "POST", "/api/v1/reserve", `{"client_id":"b","resource":"/api/x","tokens_needed":1,"duration_seconds":60,"priority":"low"}`)
	id := decodeBody(t, rec)["reservation_id"].(string)
	rec = do(h, "DELETE", "/api/v1/reserve/"+id+"?client_id=b", "")
	if d := decodeBody(t, rec); rec.Code != 200 || d["status"] != "cancelled" || d["tokens_returned"] != 0.0 {
		t.Errorf("cancel: %d %s", rec.Code, rec.Body)
	}
}

func TestReserveBadInput(t *testing.T) {
	h, _, _ := newReserveHandler(t)
	for _, tc := range []struct{ body, field string }{
		{`{"client_id":"a","resource":"/api/x","tokens_needed":0,"duration_seconds":1}`, "tokens_needed"},
		{`{"client_id":"a","resource":"/api/x","tokens_needed":101,"duration_seconds":1}`, "tokens_needed"},
		{`{"client_id":"a","resource":"/api/x","duration_seconds":1}`, "tokens_needed"},
		{`{"client_id":"a","resource":"/api/x","tokens_needed":1,"duration_seconds":0}`, "duration_seconds"},
		{`{"client_id":"a","resource":"/api/x","tokens_needed":1,"duration_seconds":301}`, "duration_seconds"},
		{`{"client_id":"a","resource":"/api/x","tokens_needed":1,"duration_seconds":1,"priority":"urgent"}`, "priority"},
		{`{"resource":"/api/x","tokens_needed":1,"duration_seconds":1}`, "client_id"},
		{`{"client_id":"a","resource":"/elsewhere","tokens_needed":1,"duration_seconds":1}`, "resource"},
		{`{"client_id":"a","tokens":1}`, "tokens"},
		{`{"client_id":"a","tokens_needed":"1"}`, "tokens_needed"},
	} {
		rec := do(h, "POST", "/api/v1/reserve", tc.body)
		if got := decodeBody(t, rec); rec.Code != 400 || got["field"] != tc.field {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.body, rec.Code, rec.Body, tc.field)
		}
	}
	if rec := do(h, "GET", "/api/v1/reserve/nope", ""); rec.Code != 404 {
		t.Errorf("unknown id: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "POST", "/api/v1/check", `{"client_id":"a","reservation_id":"nope"}`); rec.Code != 404 {
		t.Errorf("check with an unknown id: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "POST", "/api/v1/batch-check", `{"client_id":"a","checks":[{"reservation_id":"x"}]}`); rec.Code != 400 {
		t.Errorf("batch with a reservation: %d %s", rec.Code, rec.Body)
	}
}

func TestReserveDisabled(t *testing.T) {
	h := newTestHandler(t, &fakeEngine{result: allowedResult(1, 1)})
	if rec := do(h, "POST", "/api/v1/reserve", `{}`); rec.Code != 404 {
		t.Errorf("reserve without reservations: %d", rec.Code)
	}
	if rec := do(h, "POST", "/api/v1/check", `{"client_id":"a","reservation_id":"x"}`); rec.Code != 400 {
		t.Errorf("check with a reservation, none served: %d %s", rec.Code, rec.Body)
	}
}

func FuzzReserveDecode(f *testing.F) {
	for _, s := range []string{
		`{"client_id":"a","resource":"/api/x","tokens_needed":60,"duration_seconds":60,"priority":"high"}`,
		`{"client_id":"a","tokens_needed":1,"duration_seconds":300}`, `{"tokens_needed":-1}`,
		`{"client_id":"a","client_id":"b","tokens_needed":1,"duration_seconds":1}`, `{"Client_ID":"a"}`,
		`{"duration_seconds":1e3}`, `null`, `[]`, "{\"client_id\":\"\xff\"}", `{"priority":"\u0068igh"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := decodeReserve(data)
		if err != nil {
			if status, code := statusOf(err); status != 400 || code != "invalid_request" {
				t.Fatalf("error %v maps to %d %s, want 400 invalid_request", err, status, code)
			}
			return
		}
		if a.Client == "" || a.Tokens <= 0 || a.Duration <= 0 || a.Duration > 300*time.Second || a.Priority < 1 || a.Priority > 3 {
			t.Fatalf("accepted %q as %+v", data, a)
		}
		if len(a.Resource) > MaxResourceBytes || !utf8.ValidString(a.Client) || !utf8.ValidString(a.Resource) || len(a.Client) > MaxIdentifierBytes {
			t.Fatalf("accepted identifiers of %q", data)
		}
		var rr reserveRequest
		if err := json.Unmarshal(data, &rr); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", data, err)
		}
		if rr.ClientID != a.Client || rr.Resource != a.Resource || *rr.TokensNeeded != a.Tokens {
			t.Fatalf("%q decoded as %+v, encoding/json says %+v", data, a, rr)
		}
		if strings.ContainsAny(a.Client, "\x00\n") {
			t.Fatalf("accepted a control character in %q", a.Client)
		}
	})
}

// A check refused by the limits tells a client with a queued reservation
// its place and its wait; others' refusals say nothing of it.
func TestRefusedCheckTellsQueuedPlace(t *testing.T) {
	h, _, f := newReserveHandler(t)
	if rec := do(h, "POST", "/api/v1/reserve", `{"client_id":"a","resource":"/api/x","tokens_needed":100,"duration_seconds":60}`); rec.Code != 200 {
		t.Fatalf("reserve: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "POST", "/api/v1/reserve", `{"client_id":"b","resource":"/api/x","tokens_needed":10,"duration_seconds":10}`); rec.Code != 202 {
		t.Fatalf("queued: %d %s", rec.Code, rec.Body)
	}
	f.result = deniedResult()
	rec := do(h, "POST", "/api/v1/check", `{"client_id":"b","resource":"/api/x"}`)
	m := decodeBody(t, rec)
	if rec.Code != 429 || m["queue_position"] != 1.0 || m["estimated_wait_ms"] == nil || m["estimated_wait_ms"].(float64) < 0 {
		t.Errorf("b's refused check: %d %s; want its place 1 and a wait", rec.Code, rec.Body)
	}
	rec = do(h, "POST", "/api/v1/check", `{"client_id":"c","resource":"/api/x"}`)
	if m := decodeBody(t, rec); rec.Code != 429 || m["queue_position"] != nil {
		t.Errorf("c's refused check: %d %s; want no queue place", rec.Code, rec.Body)
	}
	f.result = allowedResult(100, 50)
	rec = do(h, "POST", "/api/v1/check", `{"client_id":"b","resource":"/api/x"}`)
	if m := decodeBody(t, rec); rec.Code != 200 || m["queue_position"] != nil {
		t.Errorf("b's admitted check: %d %s; want no queue place", rec.Code, rec.Body)
	}
}
