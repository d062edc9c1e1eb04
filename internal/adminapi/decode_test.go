package adminapi

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/control"
)

var t0 = time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)

func TestDecodeErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantField string
		decode                func([]byte) error
	}{
		{"rule not object", `[1]`, "body", decRule},
		{"rule trailing", `{"id":"a"} {}`, "body", decRule},
		{"rule version type", `{"id":"a","version":"x"}`, "version", decRule},
		{"rule id type", `{"id":3}`, "id", decRule},
		{"rule no id", `{"limit":3}`, "id", decRule},
		{"rule empty", ``, "body", decRule},
		{"override unknown", `{"limits":{"api":{"limit":5}},"duration_seconds":60,"reason":"x","bogus":1}`, "bogus", decOverride},
		{"override limit type", `{"limits":{"api":{"limit":"5"}},"duration_seconds":60,"reason":"x"}`, "limits.api.limit", decOverride},
		{"override no limits", `{"duration_seconds":60,"reason":"x"}`, "limits", decOverride},
		{"override window", `{"limits":{"api":{"limit":5,"window":"soon"}},"duration_seconds":60,"reason":"x"}`, "limits.api.window", decOverride},
		{"override no reason", `{"limits":{"api":{"limit":5}},"duration_seconds":60}`, "reason", decOverride},
		{"override both ends", `{"limits":{"api":{"limit":5}},"duration_seconds":60,"expires_at":"2027-01-01T00:00:00Z","reason":"x"}`, "expires_at", decOverride},
		{"override past", `{"limits":{"api":{"limit":5}},"expires_at":"2020-01-01T00:00:00Z","reason":"x"}`, "expires_at", decOverride},
		{"override no end", `{"limits":{"api":{"limit":5}},"reason":"x"}`, "duration_seconds", decOverride},
		{"throttle scope", `{"scope":"planet","reduction_percent":50,"duration_seconds":600,"reason":"x"}`, "scope", decThrottle},
		{"throttle percent", `{"scope":"global","reduction_percent":150,"duration_seconds":600,"reason":"x"}`, "reduction_percent", decThrottle},
		{"throttle percent type", `{"scope":"global","reduction_percent":"half","duration_seconds":600,"reason":"x"}`, "reduction_percent", decThrottle},
		{"throttle target", `{"scope":"client","reduction_percent":50,"duration_seconds":600,"reason":"x"}`, "target", decThrottle},
		{"throttle reason", `{"scope":"global","reduction_percent":50,"duration_seconds":600}`, "reason", decThrottle},
		{"throttle duration", `{"scope":"global","reduction_percent":50,"duration_seconds":-1,"reason":"x"}`, "duration_seconds", decThrottle},
		{"config client", `{"resource":"/a","base_rate":10}`, "client_id", decConfig},
		{"config rate", `{"client_id":"c","resource":"/a","base_rate":0}`, "base_rate", decConfig},
		{"config type", `{"client_id":"c","resource":"/a","base_rate":1.5}`, "base_rate", decConfig},
		{"config unknown", `{"client_id":"c","resource":"/a","base_rate":1,"rate":2}`, "rate", decConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.decode([]byte(tc.body))
			var fe *control.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.wantField {
				t.Fatalf("decode(%s) = %v; want a FieldError on %q", tc.body, err, tc.wantField)
			}
		})
	}
}

func decRule(b []byte) error { _, _, err := decodeRule(b, ""); return err }
func decOverride(b []byte) error {
	_, err := decodeOverride(b, "user", "alice", t0)
	return err
}
func decThrottle(b []byte) error { _, err := decodeThrottle(b, t0); return err }
func decConfig(b []byte) error   { _, err := decodeConfig(b); return err }

func TestDecodeGood(t *testing.T) {
	r, reason, err := decodeRule([]byte(`{"limit":5,"window":"1m","version":3,"reason":"why"}`), "api")
	if err != nil || r.ID != "api" || r.Version != 3 || reason != "why" || !strings.Contains(string(r.Spec), `"id":"api"`) || strings.Contains(string(r.Spec), "version") {
		t.Fatalf("decodeRule = %+v %q %v", r, reason, err)
	}
	o, err := decodeOverride([]byte(`{"limits":{"api":{"limit":500,"window":"1m"}},"duration_seconds":3600,"reason":"launch"}`), "user", "alice", t0)
	if err != nil || !o.ExpiresAt.Equal(t0.Add(time.Hour)) || o.Limits["api"].Limit != 500 {
		t.Fatalf("decodeOverride = %+v, %v", o, err)
	}
	th, err := decodeThrottle([]byte(`{"scope":"global","reduction_percent":50,"duration_seconds":600,"reason":"incident"}`), t0)
	if err != nil || th.ReductionPercent != 50 || !th.ExpiresAt.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("decodeThrottle = %+v, %v", th, err)
	}
}

// FuzzAdminDecode feeds every admin decoder the same bytes: none may
// panic, and each either decodes or answers a *control.FieldError.
func FuzzAdminDecode(f *testing.F) {
	for _, s := range []string{
		`{"id":"api","match":{"resource":"/api/*"},"limit":100,"window":"1m","version":2}`,
		`{"limits":{"api":{"limit":500,"window":"1m"}},"duration_seconds":3600,"reason":"launch"}`,
		`{"limits":{"api":{"limit":5}},"expires_at":"2027-01-01T00:00:00Z","reason":"x"}`,
		`{"scope":"client","target":"acme","reduction_percent":50,"duration_seconds":600,"reason":"incident"}`,
		`{"client_id":"c","resource":"/a","algorithm":"token_bucket","base_rate":10,"burst_capacity":20,"cost_multipliers":{"POST":2}}`,
		`{"tier":"gold","version":1}`, `null`, `[]`, `{"id":null}`, `{"duration_seconds":1e309}`, "{\"reason\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for name, dec := range map[string]func([]byte) error{
			"rule": decRule, "override": decOverride, "throttle": decThrottle, "config": decConfig,
			"rule by path": func(b []byte) error { _, _, err := decodeRule(b, "p"); return err },
			"tier":         func(b []byte) error { var r tierRequest; return decodeStrict(b, &r) },
		} {
			err := dec(data)
			var fe *control.FieldError
			if err != nil && !errors.As(err, &fe) {
				t.Fatalf("%s: %v is not a FieldError", name, err)
			}
		}
	})
}
