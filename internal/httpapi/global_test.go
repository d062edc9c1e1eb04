package httpapi

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// The answer of a check of a rule with only a global limit, decided by
// the real engine: the headers' and the body's limit and remaining are
// the global ones, global_remaining is theirs, the one rules entry says
// global, a denial is global_limit_exceeded, and the status lists it.
func TestGlobalOnlyAnswer(t *testing.T) {
	p, err := policy.Parse("t.yaml", []byte("version: 1\nrules:\n  - { id: g, window: 1m, global_limit: 2 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return testNow }
	st, err := memory.New(memory.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, Policy: p, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Engine: eng, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	type rule struct {
		Rule      string `json:"rule"`
		Limit     int64  `json:"limit"`
		Remaining int64  `json:"remaining"`
		Global    bool   `json:"global"`
	}
	var body struct {
		Allowed         bool   `json:"allowed"`
		Limit           int64  `json:"limit"`
		Remaining       int64  `json:"remaining"`
		GlobalRemaining *int64 `json:"global_remaining"`
		Error           string `json:"error"`
		Rules           []rule `json:"rules"`
		Limits          []rule `json:"limits"`
	}
	for i, want := range []int{200, 200, 429} {
		rec := do(h, "POST", "/api/v1/check", `{"client_id":"c"}`)
		body.Rules = nil
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("check %d: %v: %s", i, err, rec.Body)
		}
		left := int64(max(1-i, 0))
		hd := rec.Header()
		if rec.Code != want || body.Limit != 2 || body.Remaining != left || body.GlobalRemaining == nil || *body.GlobalRemaining != left ||
			hd.Get("X-RateLimit-Limit") != "2" || hd.Get("X-RateLimit-Global-Remaining") != hd.Get("X-RateLimit-Remaining") {
			t.Errorf("check %d: status %d, headers %v, body %s; want %d with the global limit 2, %d remaining", i, rec.Code, hd, rec.Body, want, left)
		}
		if len(body.Rules) != 1 || body.Rules[0] != (rule{"g", 2, left, true}) {
			t.Errorf("check %d: rules %+v, want one global entry", i, body.Rules)
		}
		if want == 429 && body.Error != "global_limit_exceeded" {
			t.Errorf("denial: error %q, want global_limit_exceeded", body.Error)
		}
	}
	rec := do(h, "GET", "/api/v1/status/c", "")
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("status: %v: %s", err, rec.Body)
	}
	if rec.Code != 200 || len(body.Limits) != 1 || body.Limits[0] != (rule{"g", 2, 0, true}) {
		t.Errorf("status: %d %s, want the global limit with none remaining", rec.Code, rec.Body)
	}
}
