package pganalytics

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

// BenchmarkIngest measures the whole way of the events into PostgreSQL:
// Record, the fold into per-minute rollups, and the COPY of the rollups
// and of the blocked events one by one at each flush, one after the other.
// An op is a minute of 50,000 events from 10,000 clients, each on one of
// two resources and two regions, one event in ten blocked: up to 20,000
// rollups and 5,000 blocked events a flush. events/s is the figure to
// read; "memory" is the fold alone, without PostgreSQL, as reference.
func BenchmarkIngest(b *testing.B) {
	for _, sink := range []string{"memory", "postgres"} {
		b.Run(sink, func(b *testing.B) {
			cfg := analytics.Config{FlushInterval: time.Hour, Memory: analytics.NewMemory(analytics.MemoryConfig{Retention: 1 << 62})}
			if sink == "postgres" {
				now := day0
				s, err := Open(context.Background(), Config{URL: server.NewDatabase(b), Now: func() time.Time { return now }, Retention: 1 << 62})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				cfg.Sink = s
			}
			rec := analytics.NewRecorder(cfg)
			defer rec.Close()
			const perMinute, clients = 50_000, 10_000
			names := make([]string, clients)
			for i := range names {
				names[i] = "client-" + strconv.Itoa(i)
			}
			resources, regions := [2]string{"/api/a", "/api/b"}, [2]string{"eu", "us"}
			ctx := context.Background()
			minute := day0
			start := time.Now()
			for b.Loop() {
				for i := range perMinute {
					c := i % clients
					rec.Record(analytics.Event{Time: minute.Add(time.Duration(i%60) * time.Second), Client: names[c],
						Resource: resources[c%2], Region: regions[c/2%2], Rule: "r", Reason: analytics.ReasonOverLimit,
						Allowed: i%10 != 0, Cost: 1, Latency: time.Duration(20+i%200) * time.Microsecond})
				}
				if err := rec.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				minute = minute.Add(time.Minute)
			}
			took := time.Since(start)
			st := rec.Stats()
			if st.Dropped != 0 || st.SinkErrors != 0 {
				b.Fatalf("stats %+v: events dropped or writes failed", st)
			}
			b.ReportMetric(float64(st.Recorded)/took.Seconds(), "events/s")
		})
	}
}
