package pganalytics

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestMigrateConcurrent: instances that start together on a new database,
// each with its own pool, all succeed, and each migration is applied by
// exactly one of them.
func TestMigrateConcurrent(t *testing.T) {
	ctx := context.Background()
	const instances = 4
	for round := range 10 {
		url := server.NewDatabase(t)
		var wg sync.WaitGroup
		applied := make([][]int, instances)
		errs := make([]error, instances)
		for i := range instances {
			wg.Go(func() {
				pool, err := pgxpool.New(ctx, url)
				if err != nil {
					errs[i] = err
					return
				}
				defer pool.Close()
				applied[i], errs[i] = Migrate(ctx, pool)
			})
		}
		wg.Wait()
		var all []int
		for i := range instances {
			if errs[i] != nil {
				t.Fatalf("round %d, instance %d: %v", round, i, errs[i])
			}
			all = append(all, applied[i]...)
		}
		slices.Sort(all)
		if want := versions(t); !slices.Equal(all, want) {
			t.Errorf("round %d: the instances applied %v together, want %v once each", round, all, want)
		}
	}
}

// TestMigrateFailedRetried: a migration that fails halfway leaves neither
// its changes nor its row, the ones before it stay applied, and the next
// run applies it once it is fixed.
func TestMigrateFailedRetried(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, server.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	fsys := fstest.MapFS{
		"migrations/0001_a.sql": {Data: []byte("CREATE TABLE a (x int);")},
		"migrations/0002_b.sql": {Data: []byte("CREATE TABLE b (x int); SELECT 1/0;")},
	}
	got, err := migrate(ctx, pool, fsys)
	if err == nil || !strings.Contains(err.Error(), "0002_b.sql") {
		t.Errorf("failing run: err %v, want one naming 0002_b.sql", err)
	}
	if !slices.Equal(got, []int{1}) {
		t.Errorf("failing run applied %v, want [1]", got)
	}
	var b, rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'b'").Scan(&b); err != nil || b != 0 {
		t.Errorf("table b: %d (err %v), want rolled back", b, err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&rows); err != nil || rows != 1 {
		t.Errorf("schema_migrations has %d rows (err %v), want 1", rows, err)
	}
	fsys["migrations/0002_b.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE b (x int);")}
	if got, err := migrate(ctx, pool, fsys); err != nil || !slices.Equal(got, []int{2}) {
		t.Errorf("next run applied %v (err %v), want [2]", got, err)
	}
}

// versions returns the versions of the migrations the package ships.
func versions(t *testing.T) []int {
	t.Helper()
	ms, err := loadMigrations(migrations)
	if err != nil {
		t.Fatal(err)
	}
	var vs []int
	for _, m := range ms {
		vs = append(vs, m.version)
	}
	return vs
}
