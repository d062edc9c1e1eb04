package pganalytics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

// TestLists: changes and anomalies written through a Recorder come back
// from PostgreSQL as from memory: those of the range, newest first,
// anomalies narrowed by client; and their partitions follow the retention.
func TestLists(t *testing.T) {
	now := day0.Add(2 * 24 * time.Hour)
	s := open(t, Config{Now: func() time.Time { return now }})
	mem := analytics.NewMemory(analytics.MemoryConfig{Retention: 7 * 24 * time.Hour})
	rec := analytics.NewRecorder(analytics.Config{Memory: mem, Sink: s, FlushInterval: time.Hour, Now: func() time.Time { return now }})
	defer rec.Close()
	for i := range 4 {
		rec.RecordChange(analytics.Change{Time: day0.Add(time.Duration(i) * 12 * time.Hour), Kind: "control_plane_change",
			Detail: fmt.Sprint("create throttle t", i)})
	}
	ctx := context.Background()
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	as := []analytics.Anomaly{
		{Kind: analytics.AnomalyRequests, Client: "a", Resource: "/r", Region: "eu", Minute: day0.Add(time.Hour).Unix(), Observed: 1000, Baseline: 99.5},
		{Kind: analytics.AnomalyBlockRate, Client: "b", Resource: "/r", Region: "eu", Minute: day0.Add(25 * time.Hour).Unix(), Observed: 0.9, Baseline: 0.01},
	}
	if err := s.WriteLists(ctx, nil, as); err != nil {
		t.Fatal(err)
	}
	mem.AddAnomalies(now, as)
	for _, f := range []analytics.Filter{
		{Start: day0, End: now},
		{Start: day0.Add(6 * time.Hour), End: day0.Add(30 * time.Hour)},
		{Start: day0, End: now, Client: "a"},
	} {
		got, err := s.Query(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := mem.Query(ctx, f)
		if fmt.Sprint(got.Changes, got.Anomalies) != fmt.Sprint(want.Changes, want.Anomalies) || len(got.Changes) == 0 {
			t.Errorf("%v to %v: PostgreSQL and memory differ:\n%v %v\n%v %v", f.Start, f.End, got.Changes, got.Anomalies, want.Changes, want.Anomalies)
		}
	}
	got, _ := s.Query(ctx, analytics.Filter{Start: day0, End: now, Client: "a"})
	if len(got.Changes) != 4 || got.Changes[0].Detail != "create throttle t3" || len(got.Anomalies) != 1 || got.Anomalies[0] != as[0] {
		t.Errorf("client a: changes %v, anomalies %v", got.Changes, got.Anomalies)
	}
	// A retention of a day: day 0's partitions go.
	s.cfg.Retention = 24 * time.Hour
	if err := s.Maintain(ctx, now); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Query(ctx, analytics.Filter{Start: day0, End: now})
	if len(got.Changes) != 2 || len(got.Anomalies) != 1 {
		t.Errorf("after a day's retention: changes %v, anomalies %v", got.Changes, got.Anomalies)
	}
}
