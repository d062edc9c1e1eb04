package migrate

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestFailedMigrationRetried: when a migration fails (here 0004, whose
// analytics_hourly a table made beforehand already holds), each runner
// keeps the ones before it, rolls the failed one back whole (its other
// table, analytics_client_days, is not there) and applies it and the rest
// on the next start, once the cause is gone.
func TestFailedMigrationRetried(t *testing.T) {
	ctx := context.Background()
	fsys := gooseFS(t, os.DirFS(sqlDir))
	want := wantVersions(t)
	for _, r := range runners {
		t.Run(r.name, func(t *testing.T) {
			url := newDatabase(t)
			execSQL(t, url, "CREATE TABLE analytics_hourly (x int)")
			got, err := r.up(ctx, url, fsys)
			if err == nil {
				t.Fatal("first start: no error, want 0004 failing")
			}
			if !slices.Equal(got, want[:3]) {
				t.Errorf("first start applied %v, want %v", got, want[:3])
			}
			var left bool
			query(t, url, "SELECT to_regclass('analytics_client_days') IS NOT NULL", &left)
			if left {
				t.Error("analytics_client_days is there: the failed migration was not rolled back")
			}
			execSQL(t, url, "DROP TABLE analytics_hourly")
			if got, err := r.up(ctx, url, fsys); err != nil || !slices.Equal(got, want[3:]) {
				t.Errorf("next start applied %v (err %v), want %v", got, err, want[3:])
			}
		})
	}
}

// BenchmarkConcurrentStart reports the median time (ms) for two instances
// that start together on a new database to both have migrated it, and
// fails unless both succeed and each migration was applied once.
func BenchmarkConcurrentStart(b *testing.B) {
	ctx := context.Background()
	fsys := gooseFS(b, os.DirFS(sqlDir))
	want := wantVersions(b)
	for _, r := range runners {
		b.Run(r.name, func(b *testing.B) {
			var times []time.Duration
			for b.Loop() {
				b.StopTimer()
				url := newDatabase(b)
				b.StartTimer()
				var (
					wg      sync.WaitGroup
					applied [2][]int64
					errs    [2]error
				)
				start := time.Now()
				for i := range 2 {
					wg.Go(func() { applied[i], errs[i] = r.up(ctx, url, fsys) })
				}
				wg.Wait()
				times = append(times, time.Since(start))
				all := slices.Concat(applied[0], applied[1])
				slices.Sort(all)
				if errs[0] != nil || errs[1] != nil || !slices.Equal(all, want) {
					b.Fatalf("applied %v and %v (errors %v, %v), want %v once", applied[0], applied[1], errs[0], errs[1], want)
				}
			}
			b.ReportMetric(median(times), "ms-median")
		})
	}
}

// execSQL runs one statement on the database of url.
func execSQL(tb testing.TB, url, stmt string) {
	tb.Helper()
	query(tb, url, stmt, nil)
}

// query runs one statement on the database of url and scans its row into
// dest, when there is one.
func query(tb testing.TB, url, stmt string, dest any) {
	tb.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(ctx)
	if dest == nil {
		_, err = c.Exec(ctx, stmt)
	} else {
		err = c.QueryRow(ctx, stmt).Scan(dest)
	}
	if err != nil {
		tb.Fatalf("%s: %v", stmt, err)
	}
}
