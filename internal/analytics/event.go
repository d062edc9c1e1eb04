package analytics

import "time"

// Event is one decision of the limiter, as the check path reports it. Its
// fields are the engine's check and result copied as they are: strings are
// shared, not copied, so building an Event costs no allocation. From an
// engine Check c and Result r decided at now in d:
//
//	Event{Time: now, Client: c.ClientID, Resource: c.Resource, Region: region,
//		Rule: r.Deciding.Rule, Reason: reason, Allowed: r.Allowed,
//		Cost: r.Deciding.Cost, Latency: d}
//
// where reason is one of the Reason constants, picked from r.Unavailable
// and r.ThrottlePercent, so that it too is a string that exists already.
type Event struct {
	// Time is when the check was decided; it picks the event's minute.
	Time time.Time
	// Client is who was checked (client id, API key or user).
	Client string
	// Resource is what was asked for (resource or endpoint).
	Resource string
	// Region is the region of the instance that decided.
	Region string
	// Rule names the rule that decided; kept for blocked events.
	Rule string
	// Reason says why a blocked check was refused (over limit, throttle,
	// store down...); kept for blocked events.
	Reason string
	// Allowed is the decision.
	Allowed bool
	// Cost is the cost the check charged.
	Cost int64
	// Latency is how long the check took to decide.
	Latency time.Duration
}

// Reasons for a blocked check, as Event.Reason. Other strings are kept as
// they are; these are the ones the engine's results map to.
const (
	// ReasonOverLimit is a rule's limit reached.
	ReasonOverLimit = "over_limit"
	// ReasonThrottled is a limit reached because an emergency throttle
	// cut it.
	ReasonThrottled = "throttled"
	// ReasonUnavailable is the store not answering for a rule that fails
	// closed.
	ReasonUnavailable = "unavailable"
	// ReasonDenyList is the caller on a deny list.
	ReasonDenyList = "deny_list"
)

// Key identifies a rollup: one minute of one client on one resource in one
// region, allowed or blocked.
type Key struct {
	// Minute is the start of the minute, in Unix seconds (UTC).
	Minute   int64
	Client   string
	Resource string
	Region   string
	Blocked  bool
}

// Rollup is the counts of one Key. Rollups are additive: the sum of two
// rollups of the same key is the rollup of both sets of events.
type Rollup struct {
	Key
	// Requests is the number of checks.
	Requests int64
	// Cost is the total cost charged.
	Cost int64
	// LatencySumUS is the sum of latencies, in microseconds.
	LatencySumUS int64
	// Latency is the distribution of latencies.
	Latency Sketch
}

// keyOf returns the rollup key of ev.
func keyOf(ev *Event) Key {
	return Key{
		Minute:   ev.Time.Unix() - mod(ev.Time.Unix(), 60),
		Client:   ev.Client,
		Resource: ev.Resource,
		Region:   ev.Region,
		Blocked:  !ev.Allowed,
	}
}

// add folds ev into r.
func (r *Rollup) add(ev *Event) {
	us := ev.Latency.Microseconds()
	r.Requests++
	r.Cost += ev.Cost
	r.LatencySumUS += us
	r.Latency.Add(us)
}

// merge adds o's counts to r.
func (r *Rollup) merge(o *Rollup) {
	r.Requests += o.Requests
	r.Cost += o.Cost
	r.LatencySumUS += o.LatencySumUS
	r.Latency.Merge(&o.Latency)
}

// mod is the non-negative remainder of a divided by b.
func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
