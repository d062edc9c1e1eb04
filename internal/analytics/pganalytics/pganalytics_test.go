package pganalytics

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/analytics/pgtest"
)

// server is the package's PostgreSQL, started once by TestMain.
var server *pgtest.Server

func TestMain(m *testing.M) {
	var err error
	server, err = pgtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	server.Close()
	os.Exit(code)
}

// day0 is a fixed UTC midnight the tests count from.
var day0 = time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = server.NewDatabase(t)
	}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, server.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	got, err := Migrate(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 || got[0] != 1 || got[5] != 6 {
		t.Errorf("first run applied %v, want [1 2 3 4 5 6]", got)
	}
	got, err = Migrate(ctx, pool)
	if err != nil || len(got) != 0 {
		t.Errorf("second run applied %v (err %v), want nothing", got, err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n != 6 {
		t.Errorf("schema_migrations has %d rows (err %v), want 6", n, err)
	}
}

func TestWriteQueryExact(t *testing.T) {
	now := day0.Add(3 * 24 * time.Hour)
	s := open(t, Config{Now: func() time.Time { return now }})
	mem := analytics.NewMemory(analytics.MemoryConfig{Retention: 7 * 24 * time.Hour})
	rec := analytics.NewRecorder(analytics.Config{Memory: mem, Sink: s, FlushInterval: time.Hour, Now: func() time.Time { return now }})
	defer rec.Close()
	// 3 days x 24 hours x 2 minutes x 5 events; one in five blocked.
	const perMinute = 5
	for d := range 3 {
		for h := range 24 {
			for _, m := range []int{0, 59} {
				at := day0.Add(time.Duration(d*24+h)*time.Hour + time.Duration(m)*time.Minute + time.Second)
				for i := range perMinute {
					rec.Record(analytics.Event{Time: at, Client: fmt.Sprint("c", i%2), Resource: "/r", Region: []string{"eu", "us"}[h%2],
						Allowed: i != 0, Cost: 2, Latency: time.Duration(10*(i+1)) * time.Microsecond, Rule: "r1", Reason: "over_limit"})
				}
			}
		}
	}
	ctx := context.Background()
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := rec.Stats(); st.SinkErrors != 0 || st.Dropped != 0 {
		t.Fatalf("stats = %+v", st)
	}
	const total = 3 * 24 * 2 * perMinute
	for _, g := range []analytics.Granularity{analytics.Minute, analytics.Hour, analytics.Day} {
		f := analytics.Filter{Start: day0, End: now, Granularity: g}
		got, err := s.Query(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := mem.Query(ctx, f)
		if got.Summary != want.Summary || got.Summary.Total != total || got.Summary.Blocked != total/perMinute {
			t.Errorf("granularity %d: summary = %+v, want %+v (total %d)", g, got.Summary, want.Summary, total)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("granularity %d: PostgreSQL and memory differ:\n%v\n%v", g, got, want)
		}
		if n := []int{144, 72, 3}[g]; len(got.TimeSeries) != n {
			t.Errorf("granularity %d: %d points, want %d", g, len(got.TimeSeries), n)
		}
	}
	// Ranges of whole hours that are not whole days: the coarse tables'
	// first and last hours, and a range within one day; by resource and
	// region too.
	for _, f := range []analytics.Filter{
		{Start: day0.Add(5 * time.Hour), End: day0.Add(55 * time.Hour), Granularity: analytics.Hour},
		{Start: day0.Add(3 * time.Hour), End: day0.Add(9 * time.Hour), Granularity: analytics.Hour, Top: 1},
		{Start: day0.Add(23 * time.Hour), End: day0.Add(25 * time.Hour), Granularity: analytics.Day, Region: "us", Resource: "/r"},
	} {
		got, err := s.Query(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := mem.Query(ctx, f)
		if fmt.Sprint(got) != fmt.Sprint(want) || got.Summary.Total == 0 || len(got.TopClients) == 0 {
			t.Errorf("%v to %v: PostgreSQL and memory differ:\n%v\n%v", f.Start, f.End, got, want)
		}
	}
	got, err := s.Query(ctx, analytics.Filter{Client: "c0", Region: "eu", Start: day0, End: day0.Add(24 * time.Hour), Granularity: analytics.Day})
	if err != nil {
		t.Fatal(err)
	}
	// c0 is i = 0 (blocked) and i = 2, 4: 3 per minute, 2 minutes, 12 hours in eu.
	if got.Summary.Total != 72 || got.Summary.Blocked != 24 {
		t.Errorf("c0 in eu on day 0: %+v", got.Summary)
	}
	var events int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM analytics_blocked_events WHERE reason = $1", "over_limit").Scan(&events); err != nil || events != total/perMinute {
		t.Errorf("blocked events = %d (err %v), want %d", events, err, total/perMinute)
	}
}

func TestPartitionsRetention(t *testing.T) {
	now := day0.Add(40 * 24 * time.Hour)
	s := open(t, Config{Now: func() time.Time { return now }, Retention: 30 * 24 * time.Hour, DaysAhead: 2})
	ctx := context.Background()
	parts, err := s.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Yesterday, today and two days ahead.
	if len(parts) != 4 || !parts[0].Equal(now.AddDate(0, 0, -1)) || !parts[3].Equal(now.AddDate(0, 0, 2)) {
		t.Errorf("partitions = %v", parts)
	}
	// A write for a day 20 days back creates its partition.
	old := now.AddDate(0, 0, -20)
	if err := s.Write(ctx, []analytics.Rollup{{Key: analytics.Key{Minute: old.Unix()}, Requests: 1}}, nil); err != nil {
		t.Fatal(err)
	}
	if parts, _ = s.Partitions(ctx); len(parts) != 5 || !parts[0].Equal(old) {
		t.Errorf("after an old write: partitions = %v", parts)
	}
	// Fifteen days later the retention has passed for it.
	if err := s.Maintain(ctx, now.AddDate(0, 0, 15)); err != nil {
		t.Fatal(err)
	}
	parts, _ = s.Partitions(ctx)
	if len(parts) == 0 || !parts[0].After(old) {
		t.Errorf("after maintenance: partitions = %v, want none for %v", parts, old)
	}
	// Rows older than the retention are not written at all.
	if err := s.Write(ctx, []analytics.Rollup{{Key: analytics.Key{Minute: now.AddDate(0, 0, -31).Unix()}, Requests: 1}}, nil); err != nil {
		t.Errorf("write of expired rows: %v", err)
	}
}
