package pganalytics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/analyticsapi"
)

// TestBigQuery seeds 30 days of rollups of 10,000 clients (one rollup per
// client every SLUICE_ANALYTICS_BIG_HOURS hours, 4 by default: 1.8 million
// rows, about 1.7 GB), written as the Recorder writes them, and times GET
// /api/v1/analytics over them through the API's handler: the 30 days of
// one client must answer within 200 ms from the index on (client, minute),
// which EXPLAIN must show, and so must every client's by day or hour,
// from the coarse tables. It runs with SLUICE_ANALYTICS_BIG=1 only:
//
//	SLUICE_ANALYTICS_BIG=1 go test -run TestBigQuery -v ./internal/analytics/pganalytics
func TestBigQuery(t *testing.T) {
	if os.Getenv("SLUICE_ANALYTICS_BIG") != "1" {
		t.Skip("set SLUICE_ANALYTICS_BIG=1 to seed 30 days of 10,000 clients and time the queries")
	}
	every := 4
	if v := os.Getenv("SLUICE_ANALYTICS_BIG_HOURS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 24 {
			t.Fatalf("SLUICE_ANALYTICS_BIG_HOURS=%q: want 1 to 24", v)
		}
		every = n
	}
	const clients, days = 10_000, 30
	end := day0.Add(days * 24 * time.Hour)
	s := open(t, Config{Now: func() time.Time { return end }, Retention: 40 * 24 * time.Hour})
	ctx := context.Background()
	seedStart := time.Now()
	var sk analytics.Sketch
	for _, us := range []int64{40, 60, 90, 400} {
		sk.Add(us)
	}
	// Written as the Recorder writes them, a day at a time: each client's
	// rows at its own minute of the hour, on one of two resources and two
	// regions, one row in ten blocked.
	names := make([]string, clients)
	for c := range names {
		names[c] = "client-" + strconv.Itoa(c)
	}
	var rs []analytics.Rollup
	for d := range days {
		rs = rs[:0]
		for h := 0; h < 24; h += every {
			for c := range clients {
				at := day0.Add(time.Duration(d*24+h)*time.Hour + time.Duration(c%60)*time.Minute)
				rs = append(rs, analytics.Rollup{Key: analytics.Key{Minute: at.Unix(), Client: names[c],
					Resource: []string{"/api/a", "/api/b"}[c%2], Region: []string{"eu", "eu", "us"}[c%3], Blocked: (c+h)%10 == 0},
					Requests: 4, Cost: 4, LatencySumUS: 590, Latency: sk})
			}
		}
		if err := s.Write(ctx, rs, nil); err != nil {
			t.Fatal(err)
		}
		if d == 0 {
			t.Logf("%d rollups a day", len(rs))
		}
	}
	for _, table := range tables {
		if _, err := s.pool.Exec(ctx, "ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
	var sizes []string
	for _, table := range tables {
		var size string
		var n int64
		s.pool.QueryRow(ctx, `SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))), sum(c.reltuples)::bigint
			FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
			WHERE p.relname = $1`, table).Scan(&size, &n)
		sizes = append(sizes, fmt.Sprintf("%s %d rows, %s", table, n, size))
	}
	t.Logf("seeded %d days of %d clients, a rollup every %dh, in %s: %s (with indexes)", days, clients, every,
		time.Since(seedStart).Round(time.Second), strings.Join(sizes, "; "))

	// EXPLAIN of one client's 30 days.
	f := analytics.Filter{Client: "client-42", Start: day0, End: end, Granularity: analytics.Day}
	q, args := rollupQuery(&f)
	rows, err := s.pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	rows.Close()
	text := strings.Join(plan, "\n")
	t.Logf("EXPLAIN ANALYZE of one client's 30 days:\n%s", text)
	if !strings.Contains(text, "client_minute") {
		t.Errorf("the plan uses no index on (client, minute)")
	}

	h, err := analyticsapi.New(analyticsapi.Config{Store: s, Now: func() time.Time { return end }, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, query string
		bound       time.Duration // 0: reported only
	}{
		{"one client, 30 days, by day", "client_id=client-42&granularity=day&start_time=" + day0.Format(time.RFC3339), 200 * time.Millisecond},
		{"one client, 30 days, by hour", "client_id=client-42&granularity=hour&start_time=" + day0.Format(time.RFC3339), 200 * time.Millisecond},
		{"every client, last 4 hours, by minute", "granularity=minute&start_time=" + end.Add(-4*time.Hour).Format(time.RFC3339), 0},
		{"one resource, last day, by hour", "resource=/api/a&granularity=hour&start_time=" + end.Add(-24*time.Hour).Format(time.RFC3339), 0},
		{"every client, 30 days, by day", "granularity=day&start_time=" + day0.Format(time.RFC3339), 200 * time.Millisecond},
		{"one resource, 30 days, by day", "resource=/api/a&granularity=day&start_time=" + day0.Format(time.RFC3339), 200 * time.Millisecond},
		{"every client, 30 days, by hour", "granularity=hour&start_time=" + day0.Format(time.RFC3339), 200 * time.Millisecond},
		{"every client, last 24 hours, by hour", "granularity=hour&start_time=" + end.Add(-24*time.Hour-30*time.Minute).Format(time.RFC3339) +
			"&end_time=" + end.Add(-30*time.Minute).Format(time.RFC3339), 200 * time.Millisecond},
		{"every client, 7 days to mid-day, by hour", "granularity=hour&start_time=" + end.Add(-7*24*time.Hour-12*time.Hour).Format(time.RFC3339) +
			"&end_time=" + end.Add(-12*time.Hour).Format(time.RFC3339), 200 * time.Millisecond},
	} {
		best := time.Duration(1 << 62)
		var body string
		runs := 3
		if c.bound == 0 {
			runs = 1
		}
		for range runs {
			rec := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/analytics?"+c.query, nil))
			best = min(best, time.Since(start))
			if rec.Code != http.StatusOK {
				t.Fatalf("%s: %d %s", c.name, rec.Code, rec.Body)
			}
			body = rec.Body.String()
		}
		t.Logf("%-38s best of %d: %8.1f ms, %d bytes", c.name, runs, float64(best.Microseconds())/1000, len(body))
		if c.bound > 0 && best > c.bound {
			t.Errorf("%s: %s, want under %s", c.name, best, c.bound)
		}
	}
}
