package adminapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
)

// Tokens of the tests, one per role.
var testTokens = []control.Token{
	{Name: "viewer", Role: control.RoleViewer, SHA256: auth.Hash("viewer-secret")},
	{Name: "operator", Role: control.RoleOperator, SHA256: auth.Hash("operator-secret")},
	{Name: "admin", Role: control.RoleAdmin, SHA256: auth.Hash("admin-secret")},
}

// newHandler returns the API over a real Plane with testTokens, at the
// clock now (read by the plane's own goroutines too).
func newHandler(t *testing.T, clock func() time.Time) *Handler {
	t.Helper()
	h, err := New(Config{Plane: newPlane(t, clock), Tokens: testTokens, Now: clock,
		Limits: func(kind, value string) any { return map[string]string{"kind": kind, "value": value} }})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// do sends method path with body as token (no token when "") and returns
// the recorded answer.
func do(h http.Handler, token, method, path, body string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token+"-secret")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

const testRule = `{"id":"api","match":{"resource":"/api/*"},"dimension":"client","algorithm":"token_bucket","limit":100,"window":"1m"}`

// TestRoutesByRole checks every route of the table with no token and a
// token of each role: 401, 403, or an answer that is not about auth.
func TestRoutesByRole(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	h := newHandler(t, func() time.Time { return now })
	samples := map[string]struct{ path, body string }{
		"GET /api/v1/rules":                                 {"/api/v1/rules", ""},
		"GET /api/v1/rules/{id}":                            {"/api/v1/rules/api", ""},
		"POST /api/v1/rules":                                {"/api/v1/rules", testRule},
		"PUT /api/v1/rules/{id}":                            {"/api/v1/rules/api", testRule},
		"DELETE /api/v1/rules/{id}":                         {"/api/v1/rules/api", ""},
		"GET /api/v1/{kind}/{id}/limits":                    {"/api/v1/users/alice/limits", ""},
		"GET /api/v1/{kind}/{id}/overrides":                 {"/api/v1/clients/acme/overrides", ""},
		"PUT /api/v1/{kind}/{id}/tier":                      {"/api/v1/users/alice/tier", `{"tier":"gold"}`},
		"POST /api/v1/{kind}/{id}/override":                 {"/api/v1/api-keys/k1/override", `{"limits":{"api":{"limit":5}},"duration_seconds":60,"reason":"test"}`},
		"DELETE /api/v1/{kind}/{id}/override/{override_id}": {"/api/v1/users/alice/override/o1", ""},
		"GET /api/v1/emergency/throttles":                   {"/api/v1/emergency/throttles", ""},
		"POST /api/v1/emergency/throttle":                   {"/api/v1/emergency/throttle", `{"scope":"global","reduction_percent":50,"duration_seconds":600,"reason":"test"}`},
		"DELETE /api/v1/emergency/throttle/{id}":            {"/api/v1/emergency/throttle/t1", ""},
		"GET /api/v1/configs/{id}":                          {"/api/v1/configs/c1", ""},
		"GET /api/v1/configs/{id}/versions":                 {"/api/v1/configs/c1/versions", ""},
		"POST /api/v1/configs":                              {"/api/v1/configs", `{"client_id":"acme","resource":"/api/orders","algorithm":"token_bucket","base_rate":10}`},
		"POST /api/v1/configs/{id}/rollback":                {"/api/v1/configs/c1/rollback", `{"version":1}`},
		"GET /api/v1/tokens":                                {"/api/v1/tokens", ""},
		"POST /api/v1/tokens":                               {"/api/v1/tokens", `{"name":"ci","role":"viewer"}`},
		"DELETE /api/v1/tokens/{name}":                      {"/api/v1/tokens/ci", ""},
		"GET /api/v1/audit":                                 {"/api/v1/audit", ""},
		"GET /api/v1/control/status":                        {"/api/v1/control/status", ""},
	}
	for _, rt := range h.routes() {
		key := rt.method + " " + rt.path
		s, ok := samples[key]
		if !ok {
			t.Errorf("route %s has no sample in this test", key)
			continue
		}
		for _, tok := range []string{"", "viewer", "operator", "admin"} {
			rec := do(h, tok, rt.method, s.path, s.body)
			var want string
			switch {
			case tok == "":
				want = "401"
			case auth.Rank(tok) < auth.Rank(rt.role):
				want = "403"
			}
			got := rec.Code
			switch want {
			case "401", "403":
				if want != itoa(got) {
					t.Errorf("%s as %q: %d %s; want %s", key, tok, got, rec.Body, want)
				}
			default:
				if got == 401 || got == 403 || got >= 500 {
					t.Errorf("%s as %q: %d %s; want an answer not about auth", key, tok, got, rec.Body)
				}
			}
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestRuleRace has two writers put one rule at the same version: one wins,
// the other gets 409 with the current version, and no update is lost.
func TestRuleRace(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	h := newHandler(t, func() time.Time { return now })
	if rec := do(h, "admin", "POST", "/api/v1/rules", testRule); rec.Code != 201 {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	for round := 0; round < 20; round++ {
		rec := do(h, "viewer", "GET", "/api/v1/rules/api", "")
		var cur struct{ Version int64 }
		json.Unmarshal(rec.Body.Bytes(), &cur)
		var wg sync.WaitGroup
		codes := make([]int, 2)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := strings.Replace(testRule, `"limit":100`, `"limit":`+itoa(200+i), 1)
				codes[i] = do(h, "admin", "PUT", "/api/v1/rules/api", body, "If-Match", itoa(int(cur.Version))).Code
			}()
		}
		wg.Wait()
		if !(codes[0] == 200 && codes[1] == 409 || codes[0] == 409 && codes[1] == 200) {
			t.Fatalf("round %d: codes %v; want one 200 and one 409", round, codes)
		}
		rec = do(h, "viewer", "GET", "/api/v1/rules/api", "")
		var after struct{ Version, Limit int64 }
		json.Unmarshal(rec.Body.Bytes(), &after)
		winner := int64(200)
		if codes[1] == 200 {
			winner = 201
		}
		if after.Version != cur.Version+1 || after.Limit != winner {
			t.Fatalf("round %d: after = %+v; want version %d, limit %d", round, after, cur.Version+1, winner)
		}
	}
}

// TestAuditShowsChanges checks that every change appears in the audit
// trail with its actor, before, after and reason.
func TestAuditShowsChanges(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	h := newHandler(t, func() time.Time { return now })
	for _, c := range []struct{ tok, method, path, body string }{
		{"admin", "PUT", "/api/v1/rules/api", strings.TrimSuffix(testRule, "}") + `,"reason":"new api"}`},
		{"admin", "PUT", "/api/v1/rules/api", strings.Replace(testRule, "100", "150", 1)},
		{"operator", "PUT", "/api/v1/users/alice/tier", `{"tier":"gold","reason":"upgrade"}`},
		{"operator", "POST", "/api/v1/users/alice/override", `{"limits":{"api":{"limit":500}},"duration_seconds":3600,"reason":"launch"}`},
		{"operator", "POST", "/api/v1/emergency/throttle", `{"scope":"global","reduction_percent":50,"duration_seconds":600,"reason":"incident"}`},
		{"admin", "POST", "/api/v1/configs", `{"id":"c1","client_id":"acme","resource":"/api/orders","algorithm":"token_bucket","base_rate":10}`},
	} {
		if rec := do(h, c.tok, c.method, c.path, c.body); rec.Code >= 300 {
			t.Fatalf("%s %s: %d %s", c.method, c.path, rec.Code, rec.Body)
		}
	}
	rec := do(h, "viewer", "GET", "/api/v1/audit?limit=100", "")
	var got struct{ Entries []control.AuditEntry }
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 200 {
		t.Fatalf("audit: %d %s", rec.Code, rec.Body)
	}
	want := map[string]string{"rule": "admin", "identity": "operator", "override": "operator", "throttle": "operator", "config": "admin"}
	for _, e := range got.Entries {
		if a, ok := want[e.Object]; ok && e.Actor.Name == a && len(e.After) > 0 {
			delete(want, e.Object)
		}
		if e.Object == "rule" && e.Version == 2 && (len(e.Before) == 0 || !bytes.Contains(e.After, []byte("150"))) {
			t.Errorf("rule update entry %+v; want before and after", e)
		}
		if e.Object == "override" && e.Reason != "launch" {
			t.Errorf("override entry reason %q; want launch", e.Reason)
		}
	}
	if len(want) > 0 {
		t.Errorf("no audit entry with actor and after for %v in %s", want, rec.Body)
	}
	rec = do(h, "viewer", "GET", "/api/v1/audit?object=rule&actor=admin", "")
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || len(got.Entries) != 2 {
		t.Errorf("audit filtered by object and actor: %s; want 2 entries", rec.Body)
	}
}

func TestLimitsBodyAndErrors(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	h := newHandler(t, func() time.Time { return now })
	big := `{"id":"api","x":"` + strings.Repeat("a", MaxBodyBytes) + `"}`
	for _, tc := range []struct {
		name, tok, method, path, body string
		want                          int
		wantBody                      string
	}{
		{"too large", "admin", "PUT", "/api/v1/rules/api", big, 413, `"field":"body"`},
		{"unknown field", "operator", "POST", "/api/v1/emergency/throttle", `{"scope":"global","percent":5}`, 400, `"field":"percent"`},
		{"stale version", "admin", "PUT", "/api/v1/rules/api", testRule, 409, `"current_version":0`},
		{"missing rule", "viewer", "GET", "/api/v1/rules/nope", "", 404, `"not_found"`},
		{"bad kind", "viewer", "GET", "/api/v1/robots/r2/limits", "", 404, `"not_found"`},
		{"bad since", "viewer", "GET", "/api/v1/audit?since=yesterday", "", 400, `"field":"since"`},
		{"limits", "viewer", "GET", "/api/v1/users/alice/limits", "", 200, `"limits":{"kind":"user","value":"alice"}`},
	} {
		var hdr []string
		if tc.name == "stale version" {
			hdr = []string{"If-Match", "7"}
		}
		rec := do(h, tc.tok, tc.method, tc.path, tc.body, hdr...)
		if rec.Code != tc.want || !strings.Contains(rec.Body.String(), tc.wantBody) {
			t.Errorf("%s: %d %s; want %d with %s", tc.name, rec.Code, rec.Body, tc.want, tc.wantBody)
		}
	}
}

func TestRateLimit(t *testing.T) {
	var at atomic.Int64 // the clock moves while the plane's goroutines read it
	at.Store(time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC).UnixNano())
	h := newHandler(t, func() time.Time { return time.Unix(0, at.Load()).UTC() })
	for i := range WritesPerMinute {
		if rec := do(h, "operator", "DELETE", "/api/v1/emergency/throttle/none", ""); rec.Code == 429 {
			t.Fatalf("write %d: 429 before the limit", i+1)
		}
	}
	rec := do(h, "operator", "DELETE", "/api/v1/emergency/throttle/none", "")
	if rec.Code != 429 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), `"rate_limited"`) {
		t.Fatalf("write over the limit: %d %v %s; want 429 with Retry-After", rec.Code, rec.Header(), rec.Body)
	}
	if rec := do(h, "operator", "GET", "/api/v1/emergency/throttles", ""); rec.Code != 200 {
		t.Fatalf("read after writes ran out: %d; reads have their own limit", rec.Code)
	}
	if rec := do(h, "admin", "DELETE", "/api/v1/emergency/throttle/none", ""); rec.Code == 429 {
		t.Fatal("another token was limited too")
	}
	at.Add(int64(2 * time.Minute))
	if rec := do(h, "operator", "DELETE", "/api/v1/emergency/throttle/none", ""); rec.Code == 429 {
		t.Fatal("still limited two minutes later")
	}
}

func TestDisabledWithoutTokens(t *testing.T) {
	h, err := New(Config{Plane: newPlane(t, time.Now)})
	if err != nil {
		t.Fatal(err)
	}
	rec := do(h, "admin", "GET", "/api/v1/rules", "")
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), "--admin-tokens") {
		t.Fatalf("no tokens: %d %s; want 404 naming --admin-tokens", rec.Code, rec.Body)
	}
}
