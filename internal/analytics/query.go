package analytics

import (
	"cmp"
	"errors"
	"slices"
	"time"
)

// ErrBadFilter is returned by Query for a filter it cannot answer.
var ErrBadFilter = errors.New("sluice: analytics: bad filter")

// Granularity is the width of a point of a time series.
type Granularity int

const (
	// Minute points, the rollups' own resolution.
	Minute Granularity = iota
	// Hour points.
	Hour
	// Day points, in UTC days.
	Day
)

// seconds returns the width of a point, in seconds.
func (g Granularity) seconds() int64 {
	switch g {
	case Hour:
		return 3600
	case Day:
		return 86400
	}
	return 60
}

// Filter selects the rollups a Query sums. Empty strings match every
// client, resource or region.
type Filter struct {
	Client, Resource, Region string
	// Start and End bound the minutes counted: Start <= minute < End.
	Start, End time.Time
	// Granularity is the width of the time series' points.
	Granularity Granularity
	// Top is the length of the top lists; zero means 10.
	Top int
}

// Validate reports whether f can be answered: Start before End and a
// known granularity. The error wraps ErrBadFilter.
func (f *Filter) Validate() error {
	if f.Start.IsZero() || f.End.IsZero() || !f.End.After(f.Start) {
		return errors.Join(ErrBadFilter, errors.New("start must be before end"))
	}
	if f.Granularity < Minute || f.Granularity > Day {
		return errors.Join(ErrBadFilter, errors.New("unknown granularity"))
	}
	return nil
}

// matches reports whether k passes f's client, resource and region.
func (f *Filter) matches(k *Key) bool {
	return (f.Client == "" || f.Client == k.Client) &&
		(f.Resource == "" || f.Resource == k.Resource) &&
		(f.Region == "" || f.Region == k.Region)
}

// Summary is the counts of a set of rollups.
type Summary struct {
	Total, Allowed, Blocked int64
	// Cost is the cost charged, allowed and blocked checks alike.
	Cost int64
	// BlockRate is Blocked/Total, 0 when Total is 0.
	BlockRate float64
	// AvgLatencyUS is the mean latency in microseconds.
	AvgLatencyUS float64
	// P99LatencyUS is the 99th percentile of latency in microseconds, as
	// the upper bound of its sketch bucket.
	P99LatencyUS float64
}

// RegionSummary is the Summary of one region.
type RegionSummary struct {
	Region string
	Summary
}

// Point is one point of a time series: the checks of [Start, Start+width).
type Point struct {
	Start                   time.Time
	Total, Allowed, Blocked int64
}

// Top is a client or resource ranked by blocked checks.
type Top struct {
	Name           string
	Blocked, Total int64
}

// Result is the answer to a Query.
type Result struct {
	Summary  Summary
	ByRegion []RegionSummary // by region name
	// TimeSeries has one point per granularity step that has checks, in
	// time order.
	TimeSeries   []Point
	TopClients   []Top // most blocked first
	TopResources []Top // most blocked first
	// ByResource is the Top resources by checks, most first, blocked or
	// not.
	ByResource []Top
	// Changes and Anomalies are the newest of the range, up to MaxListed
	// of each, newest first. Changes are not narrowed by client, resource
	// or region; anomalies are.
	Changes   []Change
	Anomalies []Anomaly
}

// sum is the running counts behind a Summary.
type sum struct {
	allowed, blocked, cost, latencyUS int64
	sketch                            Sketch
}

func (s *sum) add(r *Rollup) {
	if r.Blocked {
		s.blocked += r.Requests
	} else {
		s.allowed += r.Requests
	}
	s.cost += r.Cost
	s.latencyUS += r.LatencySumUS
	s.sketch.Merge(&r.Latency)
}

func (s *sum) summary() Summary {
	out := Summary{Total: s.allowed + s.blocked, Allowed: s.allowed, Blocked: s.blocked, Cost: s.cost}
	if out.Total > 0 {
		out.BlockRate = float64(out.Blocked) / float64(out.Total)
		out.AvgLatencyUS = float64(s.latencyUS) / float64(out.Total)
	}
	out.P99LatencyUS = s.sketch.Quantile(0.99)
	return out
}

// Accumulator builds a Result from rollup rows; every store uses it, so
// they all answer alike. It expects rows already filtered by the store. It
// is not safe for concurrent use.
type Accumulator struct {
	// Changes and Anomalies are copied to the Result, sorted newest
	// first; the store sets them.
	Changes   []Change
	Anomalies []Anomaly

	f         Filter
	all       sum
	regions   map[string]*sum
	points    map[int64]*Point
	clients   map[string]*Top
	resources map[string]*Top
}

// NewAccumulator returns an empty Accumulator for the answer to f.
func NewAccumulator(f Filter) *Accumulator {
	return &Accumulator{
		f:         f,
		regions:   map[string]*sum{},
		points:    map[int64]*Point{},
		clients:   map[string]*Top{},
		resources: map[string]*Top{},
	}
}

// Add counts one rollup.
func (a *Accumulator) Add(r *Rollup) {
	a.all.add(r)
	rs := a.regions[r.Region]
	if rs == nil {
		rs = &sum{}
		a.regions[r.Region] = rs
	}
	rs.add(r)

	w := a.f.Granularity.seconds()
	at := r.Minute - mod(r.Minute, w)
	p := a.points[at]
	if p == nil {
		p = &Point{Start: time.Unix(at, 0).UTC()}
		a.points[at] = p
	}
	p.Total += r.Requests
	for _, t := range []*Top{top(a.clients, r.Client), top(a.resources, r.Resource)} {
		t.Total += r.Requests
	}
	if r.Blocked {
		p.Blocked += r.Requests
		top(a.clients, r.Client).Blocked += r.Requests
		top(a.resources, r.Resource).Blocked += r.Requests
	} else {
		p.Allowed += r.Requests
	}
}

func top(m map[string]*Top, name string) *Top {
	t := m[name]
	if t == nil {
		t = &Top{Name: name}
		m[name] = t
	}
	return t
}

// Result returns the Result of the rollups added.
func (a *Accumulator) Result() Result {
	out := Result{Summary: a.all.summary()}
	for name, s := range a.regions {
		out.ByRegion = append(out.ByRegion, RegionSummary{Region: name, Summary: s.summary()})
	}
	slices.SortFunc(out.ByRegion, func(x, y RegionSummary) int { return cmp.Compare(x.Region, y.Region) })
	for _, p := range a.points {
		out.TimeSeries = append(out.TimeSeries, *p)
	}
	slices.SortFunc(out.TimeSeries, func(x, y Point) int { return x.Start.Compare(y.Start) })
	n := a.f.Top
	if n <= 0 {
		n = 10
	}
	out.TopClients = topN(a.clients, n)
	out.TopResources = topN(a.resources, n)
	out.ByResource = busiestN(a.resources, n)
	out.Changes, out.Anomalies = a.Changes, a.Anomalies
	SortChanges(out.Changes)
	SortAnomalies(out.Anomalies)
	return out
}

// topN returns the n entries of m with the most blocked checks, the
// limited ones only.
func topN(m map[string]*Top, n int) []Top {
	var out []Top
	for _, t := range m {
		if t.Blocked > 0 {
			out = append(out, *t)
		}
	}
	slices.SortFunc(out, func(x, y Top) int {
		if c := cmp.Compare(y.Blocked, x.Blocked); c != 0 {
			return c
		}
		return cmp.Compare(x.Name, y.Name)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// busiestN returns the n entries of m with the most checks.
func busiestN(m map[string]*Top, n int) []Top {
	out := make([]Top, 0, len(m))
	for _, t := range m {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(x, y Top) int {
		if c := cmp.Compare(y.Total, x.Total); c != 0 {
			return c
		}
		return cmp.Compare(x.Name, y.Name)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
