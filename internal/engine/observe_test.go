package engine

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/policy"
)

const observePolicy = `
version: 1
rules:
  - {id: per-client, limit: 1000000000, window: 1s, algorithm: token_bucket}
  - {id: per-user, match: {resource: "/api/*"}, dimension: user+endpoint, limit: 1000000000, window: 1m, algorithm: sliding_window_counter}
`

func newObserved(tb testing.TB, src string) (*Engine, *metrics.Metrics, *events.Ring) {
	tb.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		tb.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	ring := events.NewRing(10)
	e, err := New(Config{Store: newStore(tb), Local: newStore(tb), Policy: p, Now: func() time.Time { return t0 },
		Metrics: m, Events: events.New(events.Config{Sinks: []events.Sink{ring}, Metrics: m})})
	if err != nil {
		tb.Fatal(err)
	}
	return e, m, ring
}

func TestObservedStoreKeepsInfo(t *testing.T) {
	m, _ := metrics.New(prometheus.NewRegistry())
	if !observeStore(&onceStore{Store: newStore(t)}, m).Info().SharedRecords {
		t.Error("an observed store that keeps records lost them")
	}
	if observeStore(newStore(t), m).Info().SharedRecords {
		t.Error("an observed plain store gained records")
	}
}

func TestDenialEvents(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	e, _, ring := newObserved(t, "version: 1\nrules:\n  - {id: r, limit: 1, window: 1m, algorithm: fixed_window}\n")
	for range 3 {
		mustCheck(t, e, Check{ClientID: "x", User: "u", Resource: "/a", Cost: 1})
	}
	evs, _ := ring.Last(10, nil)
	if len(evs) != 2 || evs[0].Type != events.RateLimitExceeded || evs[0].Rule != "r" || evs[0].ClientID != "x" || evs[0].Limit != 1 || evs[0].RetryAfterMS != 60_000 {
		t.Errorf("events = %+v, want 2 rate_limit_exceeded of rule r", evs)
	}
}

// BenchmarkCheckObserved is BenchmarkCheck with metrics and events on: the
// difference is what observing costs per check.
func BenchmarkCheckObserved(b *testing.B) {
	if !algorithmsReady() {
		b.Skip("package algorithm cannot decide yet")
	}
	e, _, _ := newObserved(b, observePolicy)
	e.now = time.Now
	ctx := context.Background()
	c := &Check{ClientID: "bench", User: "u1", Resource: "/api/v1/orders", Method: "GET", Cost: 1}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.Check(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
}
