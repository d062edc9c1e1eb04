package daemon

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/events"
)

// TestChangeOf: the events of changes become Changes with a line of
// detail; the others (denials, bursts, reservations) do not.
func TestChangeOf(t *testing.T) {
	at := time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		ev         events.Event
		kind, want string
	}{
		{events.Event{Type: events.ConfigUpdated, Version: "v2", PreviousVersion: "v1", Path: "/etc/sluice.yaml"},
			"rate_limit_config_updated", `version "v2" applied, was "v1", from /etc/sluice.yaml`},
		{events.Event{Type: events.ConfigRejected, Version: "v2", Error: "rules[0]: limit must be positive"},
			"rate_limit_config_rejected", `version "v2" stays, rejected: rules[0]: limit must be positive`},
		{events.Event{Type: events.DenyListAdded, Identity: "ip:10.0.0.0/8", Version: "v3"},
			"rate_limit_deny_list_added", `ip:10.0.0.0/8, version "v3"`},
		{events.Event{Type: events.ControlChange, Action: "create", Object: "throttle", ObjectID: "t1", Actor: "alice", Role: "operator", Reason: "incident 7", Revision: 12},
			KindEmergencyThrottle, "create throttle t1 by alice (operator), reason: incident 7, revision 12"},
		{events.Event{Type: events.ControlChange, Action: "update", Object: "rule", ObjectID: "r1", Actor: "bob", Role: "admin", Revision: 13},
			"control_plane_change", "update rule r1 by bob (admin), revision 13"},
		{events.Event{Type: events.RateLimitExceeded, ClientID: "c"}, "", ""},
		{events.Event{Type: events.BurstBlocked, ClientID: "c"}, "", ""},
	}
	for _, tt := range tests {
		tt.ev.Time = at
		c, ok := changeOf(&tt.ev)
		if ok != (tt.kind != "") || c.Kind != tt.kind || c.Detail != tt.want || (ok && !c.Time.Equal(at)) {
			t.Errorf("%s: got %+v (%v), want kind %q, detail %q", tt.ev.Type, c, ok, tt.kind, tt.want)
		}
	}
}
