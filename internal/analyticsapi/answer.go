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
	// AnomaliesDetected is always empty: no detector is there yet.
	AnomaliesDetected []any `json:"anomalies_detected"`
	Gaps              Gaps  `json:"gaps"`
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
		AnomaliesDetected: []any{},
		Gaps:              gaps,
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
