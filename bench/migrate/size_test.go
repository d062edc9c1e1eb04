package migrate

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// pkgPrefix begins the symbols of pganalytics.
const pkgPrefix = "github.com/sluicehq/sluice/internal/analytics/pganalytics."

// runnerFuncs are the functions of migrate.go, the runner.
var runnerFuncs = []string{"Migrate", "MigrateURL", "migrate", "loadMigrations", "apply"}

// BenchmarkBinarySize builds the three commands of
// internal/migratesize and reports, in KB: the reference that only
// connects with pgx (KB-pgx-ref); what goose adds to it (KB-goose-adds:
// goose, database/sql and pgx's driver for it); what pganalytics adds
// (KB-pganalytics-adds: the runner and the whole analytics store, which
// Sluice has anyway); and the runner's own share of that (KB-runner: its
// functions' symbols and the SQL embedded). Each iteration is one round of
// builds.
func BenchmarkBinarySize(b *testing.B) {
	dir := b.TempDir()
	sizes := map[string]float64{}
	for b.Loop() {
		for _, name := range []string{"pgx", "sluice", "goose"} {
			bin := filepath.Join(dir, name)
			cmd := exec.Command("go", "build", "-o", bin, "./internal/migratesize/"+name)
			cmd.Dir = ".."
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("go build %s: %v\n%s", name, err, out)
			}
			fi, err := os.Stat(bin)
			if err != nil {
				b.Fatal(err)
			}
			sizes[name] = float64(fi.Size()) / 1024
		}
	}
	b.ReportMetric(sizes["pgx"], "KB-pgx-ref")
	b.ReportMetric(sizes["goose"]-sizes["pgx"], "KB-goose-adds")
	b.ReportMetric(sizes["sluice"]-sizes["pgx"], "KB-pganalytics-adds")
	b.ReportMetric(float64(runnerSymbols(b, filepath.Join(dir, "sluice"))+sqlBytes(b))/1024, "KB-runner")
}

// runnerSymbols returns the bytes of the runner's functions in bin, by
// go tool nm.
func runnerSymbols(b *testing.B, bin string) int {
	out, err := exec.Command("go", "tool", "nm", "-size", bin).Output()
	if err != nil {
		b.Fatalf("go tool nm: %v", err)
	}
	total := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// address size type name
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[3], pkgPrefix) {
			continue
		}
		if isRunner(strings.TrimPrefix(f[3], pkgPrefix)) {
			n, _ := strconv.Atoi(f[1])
			total += n
		}
	}
	return total
}

// isRunner reports whether the pganalytics symbol sym is one of the
// runner's functions or closures.
func isRunner(sym string) bool {
	for _, fn := range runnerFuncs {
		if rest, ok := strings.CutPrefix(sym, fn); ok && (rest == "" || rest[0] == '.') {
			return true
		}
	}
	return false
}

// sqlBytes returns the size of the migrations embedded.
func sqlBytes(b *testing.B) int {
	names, err := fs.Glob(os.DirFS(sqlDir), "migrations/*.sql")
	if err != nil {
		b.Fatal(err)
	}
	total := 0
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(sqlDir, n))
		if err != nil {
			b.Fatal(err)
		}
		total += int(fi.Size())
	}
	return total
}
