package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"testing"
	"testing/fstest"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for goose
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/sluicehq/sluice/internal/analytics/pganalytics"
	"github.com/sluicehq/sluice/internal/analytics/pgtest"
)

// sqlDir holds the SQL files that pganalytics embeds, as
// migrations/NNNN_name.sql.
const sqlDir = "../../internal/analytics/pganalytics"

// pg is the package's PostgreSQL, started by TestMain; err says why there
// is none, and the tests and benchmarks that need it then skip.
var pg struct {
	srv *pgtest.Server
	err error
}

func TestMain(m *testing.M) {
	pg.srv, pg.err = pgtest.Start()
	code := m.Run()
	if pg.srv != nil {
		pg.srv.Close()
	}
	os.Exit(code)
}

// newDatabase returns the URL of a new, empty database.
func newDatabase(tb testing.TB) string {
	tb.Helper()
	if pg.err != nil {
		tb.Skipf("no PostgreSQL: %v", pg.err)
	}
	return pg.srv.NewDatabase(tb)
}

// gooseFS returns src's migrations/*.sql at the root of an in-memory file
// system, each annotated for goose as one statement, so that goose runs a
// file as Sluice's runner does (one Exec of the whole file, in one
// transaction) rather than splitting it at semicolons, which the dollar
// quoted function bodies hold.
func gooseFS(tb testing.TB, src fs.FS) fstest.MapFS {
	tb.Helper()
	names, err := fs.Glob(src, "migrations/*.sql")
	if err != nil || len(names) == 0 {
		tb.Fatalf("migrations in %s: %v (%d files)", sqlDir, err, len(names))
	}
	out := fstest.MapFS{}
	for _, n := range names {
		b, err := fs.ReadFile(src, n)
		if err != nil {
			tb.Fatal(err)
		}
		out[path.Base(n)] = &fstest.MapFile{Data: annotate(b)}
	}
	return out
}

// annotate wraps the SQL of one migration for goose.
func annotate(sqlText []byte) []byte {
	return fmt.Appendf(nil, "-- +goose Up\n-- +goose StatementBegin\n%s\n-- +goose StatementEnd\n", sqlText)
}

// sluiceUp migrates url with Sluice's runner, as a start does: connect,
// migrate, disconnect. It returns the versions applied.
func sluiceUp(ctx context.Context, url string, _ fs.FS) ([]int64, error) {
	applied, err := pganalytics.MigrateURL(ctx, url)
	var out []int64
	for _, v := range applied {
		out = append(out, int64(v))
	}
	return out, err
}

// gooseUp migrates url with goose's Provider and its PostgreSQL session
// lock (the like of Sluice's advisory lock), over pgx's database/sql
// driver: open, migrate, close. It returns the versions applied.
func gooseUp(ctx context.Context, url string, fsys fs.FS) ([]int64, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	// On a failure goose returns the migrations applied before it in
	// the error.
	if partial := (*goose.PartialError)(nil); errors.As(err, &partial) {
		results = partial.Applied
	}
	var out []int64
	for _, r := range results {
		out = append(out, r.Source.Version)
	}
	return out, err
}

// runners are the two ways of migrating compared.
var runners = []struct {
	name string
	up   func(ctx context.Context, url string, fsys fs.FS) ([]int64, error)
}{
	{"sluice", sluiceUp},
	{"goose", gooseUp},
}

// wantVersions are the versions of the SQL files.
func wantVersions(tb testing.TB) []int64 {
	tb.Helper()
	names, err := fs.Glob(os.DirFS(sqlDir), "migrations/*.sql")
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]int64, len(names))
	for i := range names {
		out[i] = int64(i + 1)
	}
	return out
}

// BenchmarkMigrate reports the median time (ms) to migrate a new, empty
// database to the newest version (empty) and to run again once it is
// there (current), each from connecting to disconnecting. The database is
// made outside the timing.
func BenchmarkMigrate(b *testing.B) {
	ctx := context.Background()
	fsys := gooseFS(b, os.DirFS(sqlDir))
	want := wantVersions(b)
	for _, r := range runners {
		for _, phase := range []string{"empty", "current"} {
			b.Run(r.name+"/"+phase, func(b *testing.B) {
				var times []time.Duration
				for b.Loop() {
					b.StopTimer()
					url := newDatabase(b)
					wantNow := want
					if phase == "current" {
						if _, err := r.up(ctx, url, fsys); err != nil {
							b.Fatal(err)
						}
						wantNow = nil
					}
					b.StartTimer()
					start := time.Now()
					got, err := r.up(ctx, url, fsys)
					times = append(times, time.Since(start))
					if err != nil || !slices.Equal(got, wantNow) {
						b.Fatalf("applied %v (err %v), want %v", got, err, wantNow)
					}
				}
				b.ReportMetric(median(times), "ms-median")
			})
		}
	}
}

// median returns the median of ts in milliseconds.
func median(ts []time.Duration) float64 {
	s := slices.Clone(ts)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return float64(m.Microseconds()) / 1000
}
