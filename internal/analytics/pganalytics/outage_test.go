package pganalytics

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

// TestPostgresDownMidway stops PostgreSQL between two flushes: Record goes
// on, the Recorder keeps what fits in its backlog and counts the rest as
// the gap, and writing resumes once PostgreSQL is back.
func TestPostgresDownMidway(t *testing.T) {
	now := day0.Add(time.Hour)
	s := open(t, Config{Now: func() time.Time { return now }})
	const backlog = 50
	rec := analytics.NewRecorder(analytics.Config{Sink: s, MaxBacklog: backlog, FlushInterval: time.Hour, Now: func() time.Time { return now }})
	defer rec.Close()
	ctx := context.Background()
	// Every event its own client, so that a rollup is one request and the
	// rows dropped are the requests missing.
	n := 0
	record := func(count int) {
		for range count {
			n++
			rec.Record(analytics.Event{Time: day0.Add(time.Duration(n) * time.Second), Client: fmt.Sprint("c", n), Allowed: true})
		}
	}
	record(100)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	server.Kill()
	t.Cleanup(func() { server.Restart() }) // for the tests after, should this one fail
	record(200)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := rec.Stats()
	if st.SinkErrors == 0 || st.SinkBacklogRows != backlog || st.SinkDroppedRows != 200-backlog {
		t.Fatalf("while down: stats = %+v, want errors, %d rows kept, %d dropped", st, backlog, 200-backlog)
	}
	if st.Recorded != 300 || st.Dropped != 0 {
		t.Fatalf("while down: recorded %d, dropped %d; want every event aggregated", st.Recorded, st.Dropped)
	}

	if err := server.Restart(); err != nil {
		t.Fatal(err)
	}
	record(100)
	// The pool finds its old connections dead on first use; a flush or two
	// goes by before it has new ones.
	for i := 0; ; i++ {
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if rec.Stats().SinkBacklogRows == 0 {
			break
		}
		if i == 20 {
			t.Fatalf("backlog not written after restart: %+v", rec.Stats())
		}
		time.Sleep(100 * time.Millisecond)
	}
	res, err := s.Query(ctx, analytics.Filter{Start: day0, End: day0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	gap := rec.Stats().SinkDroppedRows
	if want := int64(100 + backlog + 100); res.Summary.Total != want || gap != 200-backlog {
		t.Errorf("in PostgreSQL: %d requests, want %d; gap %d, want %d", res.Summary.Total, want, gap, 200-backlog)
	}
	// The in-process store never lost anything.
	mem, _ := rec.Memory().Query(ctx, analytics.Filter{Start: day0, End: day0.Add(time.Hour)})
	if mem.Summary.Total != 400 {
		t.Errorf("in memory: %d requests, want 400", mem.Summary.Total)
	}
}

// BenchmarkCopy measures Write: batches of 1000 rollups copied into the
// real PostgreSQL in one transaction each. rows/s is the figure to read.
func BenchmarkCopy(b *testing.B) {
	now := day0.Add(time.Hour)
	s, err := Open(context.Background(), Config{URL: server.NewDatabase(b), Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const batch = 1000
	rs := make([]analytics.Rollup, batch)
	for i := range rs {
		rs[i] = analytics.Rollup{Key: analytics.Key{Minute: day0.Unix() + int64(i%60)*60, Client: fmt.Sprint("client-", i), Resource: "/api/orders", Region: "eu-west"}, Requests: 10, Cost: 10, LatencySumUS: 420}
		rs[i].Latency.Add(42)
	}
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		if err := s.Write(ctx, rs, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "rows/s")
}

// TestOpenBeforePostgres: with RetryEvery, Open returns while PostgreSQL
// is down (without it, it fails); Write and Query fail with ErrNotReady
// until PostgreSQL is up, then the Store migrates it and works.
func TestOpenBeforePostgres(t *testing.T) {
	now := day0.Add(time.Hour)
	url := server.NewDatabase(t)
	server.Kill()
	t.Cleanup(func() { server.Restart() }) // for the tests after, should this one fail
	ctx := context.Background()
	if s, err := Open(ctx, Config{URL: url}); err == nil {
		s.Close()
		t.Fatal("Open without RetryEvery succeeded with PostgreSQL down")
	}
	s := open(t, Config{URL: url, RetryEvery: 50 * time.Millisecond, Now: func() time.Time { return now }})
	if s.Ready() {
		t.Fatal("Ready with PostgreSQL down")
	}
	rs := []analytics.Rollup{{Key: analytics.Key{Minute: day0.Unix() + 60, Client: "c"}, Requests: 1}}
	if err := s.Write(ctx, rs, nil); !errors.Is(err, ErrNotReady) {
		t.Errorf("Write with PostgreSQL down: %v, want ErrNotReady", err)
	}
	f := analytics.Filter{Start: day0, End: day0.Add(time.Hour), Granularity: analytics.Hour}
	if _, err := s.Query(ctx, f); !errors.Is(err, ErrNotReady) {
		t.Errorf("Query with PostgreSQL down: %v, want ErrNotReady", err)
	}

	if err := server.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !s.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("not ready 20s after PostgreSQL came up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.Write(ctx, rs, nil); err != nil {
		t.Fatalf("Write once ready: %v", err)
	}
	res, err := s.Query(ctx, f)
	if err != nil || res.Summary.Total != 1 {
		t.Errorf("Query once ready: %+v, %v; want 1 request", res.Summary, err)
	}
}
