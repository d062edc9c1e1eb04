package pganalytics

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations are the schema's versions, NNNN_name.sql, applied in order.
//
//go:embed migrations/*.sql
var migrations embed.FS

// migrateLock is the advisory lock key that serialises instances
// migrating the same database at once.
const migrateLock = 0x736c7569636561 // "sluicea"

// migration is one embedded file.
type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations returns the migrations of fsys, migrations/NNNN_name.sql,
// in version order.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, p := range names {
		base := strings.TrimPrefix(p, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("pganalytics: migration %s: want NNNN_name.sql", base)
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: base, sql: string(b)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("pganalytics: two migrations of version %d", out[i].version)
		}
	}
	return out, nil
}

// Migrate brings the schema to the newest version: each migration not yet
// in schema_migrations runs in its own transaction, with its row, so that a
// failed one leaves nothing behind and the next start retries it. It
// returns the versions it applied; none when the schema is current.
// Instances migrating one database at once take turns, under a
// transaction-level advisory lock, so that each migration runs once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	return migrate(ctx, pool, migrations)
}

// migrate applies the migrations of fsys as Migrate does.
func migrate(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) ([]int, error) {
	ms, err := loadMigrations(fsys)
	if err != nil {
		return nil, err
	}
	// Under the lock too: two CREATE TABLE IF NOT EXISTS at once may both
	// find no table, and the second then fails on the catalogue's unique
	// index.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pganalytics: schema_migrations: %w", err)
	}
	var applied []int
	for _, m := range ms {
		done, err := apply(ctx, pool, m)
		if err != nil {
			return applied, fmt.Errorf("pganalytics: migration %s: %w", m.name, err)
		}
		if done {
			applied = append(applied, m.version)
		}
	}
	return applied, nil
}

// MigrateURL connects to the PostgreSQL of the connection string url,
// migrates it as Migrate does and disconnects. It is `sluice migrate`.
func MigrateURL(ctx context.Context, url string) ([]int, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("pganalytics: %w", err)
	}
	defer pool.Close()
	return Migrate(ctx, pool)
}

// apply runs m unless it was applied already, and reports whether it ran.
func apply(ctx context.Context, pool *pgxpool.Pool, m migration) (bool, error) {
	ran := false
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)", m.version).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		// The simple protocol runs a file of several statements at once.
		if _, err := tx.Exec(ctx, m.sql, pgx.QueryExecModeSimpleProtocol); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
			return err
		}
		ran = true
		return nil
	})
	return ran, err
}
