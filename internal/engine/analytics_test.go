package engine

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/policy"
)

// eventLog keeps the analytics events the engine hands over.
type eventLog struct{ evs []analytics.Event }

func (l *eventLog) Record(ev analytics.Event) { l.evs = append(l.evs, ev) }

func newWithAnalytics(tb testing.TB, src string, a Analytics, region string) *Engine {
	tb.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		tb.Fatal(err)
	}
	e, err := New(Config{Store: newStore(tb), Local: newStore(tb), Policy: p, Now: func() time.Time { return t0 },
		Analytics: a, Region: region})
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// TestAnalyticsEvents: one event per decision, whatever the API: a check,
// each check of a batch (an Envoy call's is internal/envoyrls'
// TestAnalyticsEvents); none for a check refused as bad input.
func TestAnalyticsEvents(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	log := &eventLog{}
	e := newWithAnalytics(t, `version: 1
rules:
  - {id: r, match: {resource: /a}, limit: 1, window: 1m, algorithm: fixed_window}
deny:
  - client: banned
`, log, "")
	ctx := context.Background()
	for range 2 {
		mustCheck(t, e, Check{ClientID: "x", Resource: "/a", Cost: 1})
	}
	mustCheck(t, e, Check{ClientID: "banned", Resource: "/a", Cost: 1})
	if _, err := e.Check(ctx, &Check{Resource: "/a"}); err == nil {
		t.Fatal("a check without client_id was decided")
	}
	if _, err := e.BatchCheck(ctx, []Check{{ClientID: "y", Resource: "/a", Cost: 1}, {ClientID: "y", Resource: "/b", Cost: 1}}, BestEffort); err != nil {
		t.Fatal(err)
	}
	want := []analytics.Event{
		{Client: "x", Resource: "/a", Rule: "r", Allowed: true, Cost: 1},
		{Client: "x", Resource: "/a", Rule: "r", Reason: analytics.ReasonOverLimit},
		{Client: "banned", Resource: "/a", Rule: "deny_list", Reason: analytics.ReasonDenyList},
		{Client: "y", Resource: "/a", Rule: "r", Allowed: true, Cost: 1},
		{Client: "y", Resource: "/b", Allowed: true},
	}
	if len(log.evs) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(log.evs), len(want), log.evs)
	}
	for i, got := range log.evs {
		if !got.Time.Equal(t0) || got.Region != "local" || got.Latency <= 0 {
			t.Errorf("event %d: time %v, region %q, latency %v", i, got.Time, got.Region, got.Latency)
		}
		got.Time, got.Region, got.Latency = time.Time{}, "", 0
		if got != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, got, want[i])
		}
	}
}

// countingAnalytics counts the events handed to it and keeps nothing.
type countingAnalytics struct{ n atomic.Int64 }

func (c *countingAnalytics) Record(analytics.Event) { c.n.Add(1) }

// TestAnalyticsAllocatesNothing: handing a check's event over costs the
// check no allocation. The sink counts and keeps nothing: a real
// Recorder's aggregator allocates on its own goroutine, which
// AllocsPerRun would count too (that Record itself allocates nothing is
// package analytics' TestRecordAllocatesNothing).
func TestAnalyticsAllocatesNothing(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	if raceEnabled {
		// `make test` runs it again without the race detector.
		t.Skip("the race detector's sync.Pool drops pooled scratch at random: allocation counts vary")
	}
	ctx := context.Background()
	sink := new(countingAnalytics)
	allocs := func(a Analytics) float64 {
		var e *Engine
		if a == nil {
			e = newWithAnalytics(t, observePolicy, nil, "")
		} else {
			e = newWithAnalytics(t, observePolicy, a, "eu")
		}
		c := &Check{ClientID: "bench", User: "u1", Resource: "/api/v1/orders", Method: "GET", Cost: 1}
		// AllocsPerRun counts the whole process's allocations, other
		// goroutines' too (the stores' sweepers, the race detector's
		// runtime): they only ever add, so the least of three is the
		// check's own.
		least := math.Inf(1)
		for range 3 {
			least = min(least, testing.AllocsPerRun(1000, func() {
				if _, err := e.Check(ctx, c); err != nil {
					t.Fatal(err)
				}
			}))
		}
		return least
	}
	without, with := allocs(nil), allocs(sink)
	if with != without {
		t.Errorf("a check allocates %v times with analytics, %v without", with, without)
	}
	if sink.n.Load() == 0 {
		t.Error("the sink received no event")
	}
}

// BenchmarkCheckAnalytics is BenchmarkCheck handing each decision to a
// Recorder: the difference is what recording costs the check path.
func BenchmarkCheckAnalytics(b *testing.B) {
	if !algorithmsReady() {
		b.Skip("package algorithm cannot decide yet")
	}
	rec := analytics.NewRecorder(analytics.Config{})
	defer rec.Close()
	e := newWithAnalytics(b, observePolicy, rec, "eu")
	e.now = time.Now
	ctx := context.Background()
	c := &Check{ClientID: "bench", User: "u1", Resource: "/api/v1/orders", Method: "GET", Cost: 1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Check(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
}
