// The last step of an Envoy call, answer: the outcomes of the limits the
// engine decided become the statuses of the descriptors, as
// envoyproxy/ratelimit gives them.

package envoyrls

import (
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
)

// answer writes to statuses the status of the descriptor of each decided
// item of l (refs[j] is the descriptor of item j, limits[i] the limit of
// descriptor i), and returns whether the request is over the limit: when
// any descriptor is, but for quota_mode ones, which make it over only when
// every one of them is.
func (d *Decider) answer(l *engine.Limits, limits []*policy.EnvoyLimit, refs []int, statuses []DescriptorStatus) (overLimit bool) {
	quotas, quotasOver := 0, 0
	var now time.Time
	for j, i := range refs {
		o := &l.Items[j].Outcome
		el := limits[i]
		if o.ResetAfter == 0 {
			// Reported as the retry-after of a denial too.
			if now.IsZero() {
				now = d.eng.Now()
			}
			o.ResetAfter = untilWindowEnd(now, el.Unit)
		}
		st := DescriptorStatus{HasLimit: true, Limit: el.RequestsPerUnit, Unit: el.Unit,
			Remaining: o.Remaining, DurationUntilReset: o.ResetAfter, Rule: el.FullKey, Shadow: el.Shadow}
		if el.QuotaMode && !el.Shadow {
			quotas++
		}
		if o.Over && !el.Shadow {
			st.OverLimit = true
			if el.QuotaMode {
				quotasOver++
			} else {
				overLimit = true
			}
		}
		statuses[i] = st
	}
	return overLimit || quotas > 0 && quotasOver == quotas
}

// untilWindowEnd returns the time from now to the end of the current
// window of length unit, aligned on the Unix epoch.
func untilWindowEnd(now time.Time, unit time.Duration) time.Duration {
	if unit <= 0 {
		return 0
	}
	us := now.UnixMicro()
	w := unit.Microseconds()
	return time.Duration(w-us%w) * time.Microsecond
}
