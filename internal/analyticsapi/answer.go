package analyticsapi

import (
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

// Answer is the JSON body of GET /api/v1/analytics. Every list is present,
// empty rather than null, so that a dashboard need not test for null.
type Answer struct {
	StartTime   time.Time `json:"start_time"`
	EndTime     time.Time `json:"end_time"`
	Granularity string    `json:"granularity"`
	Summary     Summary   `json:"summary"`
	// ByRegion is the summary of each region, by region name.
	ByRegion []RegionSummary `json:"by_region"`
	// TimeSeries has a point for each step of the granularity that had
	// checks, in time order; steps without checks are left out.
	TimeSeries []Point `json:"time_series"`
	// TopClients and TopResources are the ten most blocked, most first;
	// only those blocked at least once.
	TopClients   []Top `json:"top_clients"`
	TopResources []Top `json:"top_resources"`
	// ByResource is the ten resources with the most checks, most first,
	// blocked or not.
	ByResource []ResourceCount `json:"by_resource"`
	// AnomaliesDetected is the newest anomalies of the range (at most
	// 100, newest first): minutes of a client on a resource in a region
	// far above that key's recent baseline.
	AnomaliesDetected []Anomaly `json:"anomalies_detected"`
	// Changes is the newest changes of the range (at most 100, newest
	// first): configurations applied or rejected, list entries, control
	// plane changes such as emergency throttles. They are not narrowed by
	// client_id, resource or region.
	Changes []Change `json:"changes"`
	Gaps    Gaps     `json:"gaps"`
	// Source is where the figures come from: "postgres" (every instance
	// writing there) or "memory" (this process's last 24 hours, also when
	// PostgreSQL failed to answer).
	Source string `json:"source"`
}

// Summary is the counts of a set of checks. Latencies are the engine's
// time to decide, in microseconds; the 99th percentile is the upper bound
// of its sketch bucket (within about 19%).
type Summary struct {
	TotalRequests int64   `json:"total_requests"`
	Allowed       int64   `json:"allowed"`
	Blocked       int64   `json:"blocked"`
	BlockRate     float64 `json:"block_rate"`
	AvgLatencyUS  float64 `json:"avg_latency_us"`
	P99LatencyUS  float64 `json:"p99_latency_us"`
	Cost          int64   `json:"cost"`
}

// RegionSummary is the counts of one region.
type RegionSummary struct {
	Region        string  `json:"region"`
	TotalRequests int64   `json:"total_requests"`
	Allowed       int64   `json:"allowed"`
	Blocked       int64   `json:"blocked"`
	BlockRate     float64 `json:"block_rate"`
	AvgLatencyUS  float64 `json:"avg_latency_us"`
	P99LatencyUS  float64 `json:"p99_latency_us"`
}

// Point is the checks of one step, from Timestamp.
type Point struct {
	Timestamp     time.Time `json:"timestamp"`
	TotalRequests int64     `json:"total_requests"`
	Allowed       int64     `json:"allowed"`
	Blocked       int64     `json:"blocked"`
}

// Top is a client or a resource, and its checks.
type Top struct {
	Name          string `json:"name"`
	Blocked       int64  `json:"blocked"`
	TotalRequests int64  `json:"total_requests"`
}

// ResourceCount is a resource and its checks.
type ResourceCount struct {
	Resource      string `json:"resource"`
	TotalRequests int64  `json:"total_requests"`
	Allowed       int64  `json:"allowed"`
	Blocked       int64  `json:"blocked"`
}

// Anomaly is a minute far above its key's baseline: a client on a
// resource in a region, or (ClientID empty) a resource in a region with
// all its clients together. Kind is
// requests_spike (Observed and Baseline are checks per minute) or
// block_rate_spike (they are shares blocked, 0 to 1).
type Anomaly struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"`
	ClientID string    `json:"client_id"`
	Resource string    `json:"resource"`
	Region   string    `json:"region"`
	Observed float64   `json:"observed"`
	Baseline float64   `json:"baseline"`
}

// Change is a change kept one by one: when, what kind (the audit event's
// type) and a line of detail.
type Change struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"`
	Detail string    `json:"detail"`
}

// granularities are the names of the granularities, by value.
var granularities = [...]string{analytics.Minute: "minute", analytics.Hour: "hour", analytics.Day: "day"}

// answerOf returns the answer to f, whose result is res.
func answerOf(f analytics.Filter, res *analytics.Result, gaps Gaps) Answer {
	s := res.Summary
	a := Answer{
		StartTime: f.Start.UTC(), EndTime: f.End.UTC(), Granularity: granularities[f.Granularity],
		Summary: Summary{TotalRequests: s.Total, Allowed: s.Allowed, Blocked: s.Blocked, BlockRate: s.BlockRate,
			AvgLatencyUS: s.AvgLatencyUS, P99LatencyUS: s.P99LatencyUS, Cost: s.Cost},
		ByRegion:          make([]RegionSummary, 0, len(res.ByRegion)),
		TimeSeries:        make([]Point, 0, len(res.TimeSeries)),
		TopClients:        tops(res.TopClients),
		TopResources:      tops(res.TopResources),
		ByResource:        make([]ResourceCount, 0, len(res.ByResource)),
		AnomaliesDetected: make([]Anomaly, 0, len(res.Anomalies)),
		Changes:           make([]Change, 0, len(res.Changes)),
		Gaps:              gaps,
	}
	for _, t := range res.ByResource {
		a.ByResource = append(a.ByResource, ResourceCount{Resource: t.Name, TotalRequests: t.Total, Allowed: t.Total - t.Blocked, Blocked: t.Blocked})
	}
	for _, x := range res.Anomalies {
		a.AnomaliesDetected = append(a.AnomaliesDetected, Anomaly{Time: time.Unix(x.Minute, 0).UTC(), Kind: x.Kind,
			ClientID: x.Client, Resource: x.Resource, Region: x.Region, Observed: x.Observed, Baseline: x.Baseline})
	}
	for _, c := range res.Changes {
		a.Changes = append(a.Changes, Change{Time: c.Time.UTC(), Kind: c.Kind, Detail: c.Detail})
	}
	for _, r := range res.ByRegion {
		a.ByRegion = append(a.ByRegion, RegionSummary{Region: r.Region, TotalRequests: r.Total, Allowed: r.Allowed,
			Blocked: r.Blocked, BlockRate: r.BlockRate, AvgLatencyUS: r.AvgLatencyUS, P99LatencyUS: r.P99LatencyUS})
	}
	for _, p := range res.TimeSeries {
		a.TimeSeries = append(a.TimeSeries, Point{Timestamp: p.Start.UTC(), TotalRequests: p.Total, Allowed: p.Allowed, Blocked: p.Blocked})
	}
	return a
}

func tops(ts []analytics.Top) []Top {
	out := make([]Top, 0, len(ts))
	for _, t := range ts {
		out = append(out, Top{Name: t.Name, Blocked: t.Blocked, TotalRequests: t.Total})
	}
	return out
}
