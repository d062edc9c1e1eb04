// Changes: the audit events an operator reads one by one beside the
// analytics (configurations applied or rejected, list entries, control
// plane changes and emergency throttles), handed to the analytics
// recorder, which keeps them in memory and writes them to PostgreSQL.

package daemon

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/events"
)

// KindEmergencyThrottle is the kind of the change of an emergency
// throttle (set, changed or lifted) through the control plane; other
// control plane changes are of kind control_plane_change.
const KindEmergencyThrottle = "emergency_throttle"

// changeSink is an events.Sink that turns the events of changes into
// analytics Changes. The events recorder exists before the analytics
// recorder, so the sink gets it later; until then, and with no analytics,
// it drops the events. Emit is safe for concurrent use and never blocks
// (RecordChange does not).
type changeSink struct {
	rec atomic.Pointer[analytics.Recorder]
}

// Emit hands ev to the recorder when it is a change.
func (s *changeSink) Emit(ev *events.Event) {
	rec := s.rec.Load()
	if rec == nil {
		return
	}
	c, ok := changeOf(ev)
	if ok {
		rec.RecordChange(c)
	}
}

// changeOf returns the Change of ev, and false when ev is not a change
// (denials, bursts, fallbacks, reservations).
func changeOf(ev *events.Event) (analytics.Change, bool) {
	c := analytics.Change{Time: ev.Time, Kind: string(ev.Type)}
	var b strings.Builder
	add := func(format string, args ...any) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, format, args...)
	}
	switch ev.Type {
	case events.ConfigUpdated:
		add("version %q applied", ev.Version)
		if ev.PreviousVersion != "" {
			add("was %q", ev.PreviousVersion)
		}
		if ev.Path != "" {
			add("from %s", ev.Path)
		}
	case events.ConfigRejected:
		add("version %q stays", ev.Version)
		add("rejected: %s", ev.Error)
	case events.AllowListAdded, events.AllowListRemoved, events.DenyListAdded, events.DenyListRemoved:
		add("%s", ev.Identity)
		add("version %q", ev.Version)
	case events.ControlChange:
		if ev.Object == "throttle" {
			c.Kind = KindEmergencyThrottle
		}
		add("%s %s %s by %s (%s)", ev.Action, ev.Object, ev.ObjectID, ev.Actor, ev.Role)
		if ev.Reason != "" {
			add("reason: %s", ev.Reason)
		}
		add("revision %d", ev.Revision)
	default:
		return analytics.Change{}, false
	}
	c.Detail = b.String()
	return c, true
}
