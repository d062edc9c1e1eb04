// The wire answer: the statuses of the descriptors as Envoy's
// RateLimitResponse, in as few allocations as can be.

package envoyrls

import (
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// oneStatus is a response with one descriptor status, allocated at once.
type oneStatus struct {
	resp   rlsv3.RateLimitResponse
	st     [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status statusBlock
}

// statusBlock is a descriptor status and the messages it points to,
// allocated at once.
type statusBlock struct {
	ds    rlsv3.RateLimitResponse_DescriptorStatus
	limit rlsv3.RateLimitResponse_RateLimit
	reset durationpb.Duration
	mult  wrapperspb.UInt32Value
}

// fill makes b's status that of st, answered under cfg, and returns it.
func (b *statusBlock) fill(st *DescriptorStatus, cfg Config) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := &b.ds
	ds.Code = rlsv3.RateLimitResponse_OK
	if st.OverLimit {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if !st.HasLimit {
		// Unlimited descriptors report the largest remaining quota, as
		// envoyproxy/ratelimit does; unmatched ones report nothing.
		if st.Remaining > 0 {
			ds.LimitRemaining = clampU32(st.Remaining)
		}
		return ds
	}
	unit, mult := envoyUnit(st.Unit)
	b.limit.Name, b.limit.RequestsPerUnit, b.limit.Unit = st.Rule, clampU32(st.Limit), unit
	if mult > 1 {
		b.mult.Value = mult
		b.limit.UnitMultiplier = &b.mult
	}
	ds.CurrentLimit = &b.limit
	ds.LimitRemaining = clampU32(st.Remaining)
	if st.OverLimit && cfg.Compat {
		ds.LimitRemaining = 0 // as envoyproxy/ratelimit: 0 whatever remains
	}
	reset := st.DurationUntilReset
	if !cfg.PreciseReset {
		reset = wholeSeconds(reset)
	}
	ns := reset.Nanoseconds()
	b.reset.Seconds, b.reset.Nanos = ns/1e9, int32(ns%1e9)
	ds.DurationUntilReset = &b.reset
	return ds
}

// wholeSeconds returns d rounded up to whole seconds, as
// envoyproxy/ratelimit reports the time to the end of a window (the unit
// less the Unix second's remainder: the true time rounded up).
func wholeSeconds(d time.Duration) time.Duration {
	if r := d % time.Second; r > 0 {
		d += time.Second - r
	}
	return d
}

// units are Envoy's rate limit units, longest first, with the lengths
// envoyproxy/ratelimit gives them (a month is 30 days, a year 365).
var units = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// envoyUnit returns the Envoy unit and multiplier of a window: the longest
// unit that divides it. Windows that are not whole seconds report UNKNOWN.
func envoyUnit(d time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	for _, u := range units {
		if d >= u.d && d%u.d == 0 {
			n := d / u.d
			if n > 1<<32-1 {
				break
			}
			return u.unit, uint32(n)
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
}

func clampU32(v int64) uint32 {
	switch {
	case v < 0:
		return 0
	case v > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(v)
}
