package analytics

import (
	"cmp"
	"slices"
	"time"
)

// Change is something an operator did or the configuration did, kept one
// by one: a configuration applied or rejected, an allow or deny list
// entry added or removed, a change through the control plane (a rule, an
// override, an emergency throttle...). The daemon turns its audit events
// into Changes; this package only keeps and answers them.
type Change struct {
	// Time is when it happened.
	Time time.Time
	// Kind is what happened, as the audit event's type, such as
	// "rate_limit_config_updated" or "control_plane_change".
	Kind string
	// Detail says it in a line of text, for a reader.
	Detail string
}

// Anomaly is a minute of one client on one resource in one region whose
// checks were far above that key's recent baseline (see Detector).
type Anomaly struct {
	// Kind is AnomalyRequests or AnomalyBlockRate.
	Kind string
	// Client, Resource and Region are the key.
	Client, Resource, Region string
	// Minute is the start of the minute, in Unix seconds (UTC).
	Minute int64
	// Observed is the minute's figure (requests, or blocked/requests) and
	// Baseline the key's moving average of it before the minute.
	Observed, Baseline float64
}

// Kinds of Anomaly.
const (
	// AnomalyRequests is a minute with far more checks than usual.
	AnomalyRequests = "requests_spike"
	// AnomalyBlockRate is a minute with a far larger share blocked.
	AnomalyBlockRate = "block_rate_spike"
)

// MaxListed bounds the changes and the anomalies a Result lists: the
// newest of the range.
const MaxListed = 100

// newestChanges returns up to MaxListed changes of cs in [from, to),
// newest first. cs is in time order.
func newestChanges(cs []Change, from, to time.Time) []Change {
	var out []Change
	for i := len(cs) - 1; i >= 0 && len(out) < MaxListed; i-- {
		if t := cs[i].Time; !t.Before(from) && t.Before(to) {
			out = append(out, cs[i])
		}
	}
	return out
}

// newestAnomalies returns up to MaxListed anomalies of as that f selects,
// newest first. as is in minute order.
func newestAnomalies(as []Anomaly, f *Filter) []Anomaly {
	from, to := f.Start.Unix(), f.End.Unix()
	var out []Anomaly
	for i := len(as) - 1; i >= 0 && len(out) < MaxListed; i-- {
		a := &as[i]
		if a.Minute >= from && a.Minute < to &&
			f.matches(&Key{Client: a.Client, Resource: a.Resource, Region: a.Region}) {
			out = append(out, *a)
		}
	}
	return out
}

// SortChanges orders changes newest first, as a Result lists them.
func SortChanges(cs []Change) {
	slices.SortStableFunc(cs, func(x, y Change) int { return y.Time.Compare(x.Time) })
}

// SortAnomalies orders anomalies newest first, then by client, resource,
// region and kind, as a Result lists them.
func SortAnomalies(as []Anomaly) {
	slices.SortStableFunc(as, func(x, y Anomaly) int {
		return cmp.Or(cmp.Compare(y.Minute, x.Minute), cmp.Compare(x.Client, y.Client),
			cmp.Compare(x.Resource, y.Resource), cmp.Compare(x.Region, y.Region), cmp.Compare(x.Kind, y.Kind))
	})
}
