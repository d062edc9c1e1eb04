// Package pganalytics keeps analytics rollups in PostgreSQL, for history
// longer than one process's memory and shared by every instance. Store is
// an analytics.Sink, written with COPY in one transaction per flush, and it
// answers analytics queries with the same Result as the in-process store.
//
// The schema comes with the binary: versioned SQL files embedded in it,
// applied in order by Migrate, one transaction each, and recorded in
// schema_migrations. Rollups, blocked events, changes and anomalies are
// partitioned by UTC day; Maintain creates the coming days' partitions and drops those older
// than the retention, through SQL functions that take days as parameters,
// so that the service never builds an identifier.
//
// The connection pool reconnects by itself. While PostgreSQL is down,
// Write fails and the Recorder keeps the rows, bounded, and counts what it
// had to drop. With Config.RetryEvery, PostgreSQL need not be up when the
// Store is opened either: it migrates once PostgreSQL answers, and until
// then Write and Query fail with ErrNotReady.
package pganalytics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/analytics"
)

// Config shapes a Store.
type Config struct {
	// URL is the PostgreSQL connection string.
	URL string
	// Retention is how long rollups and events are kept; zero means 30
	// days. Partitions are dropped whole, so up to a day more is kept.
	Retention time.Duration
	// DaysAhead is how many days of partitions to create ahead of today;
	// zero means 3.
	DaysAhead int
	// MaintainInterval is how often Maintain runs in the background; zero
	// means an hour.
	MaintainInterval time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// RetryEvery, when positive, lets Open return a Store while
	// PostgreSQL cannot be reached (or migrated): the Store tries again
	// in the background, every RetryEvery, until the migrations and the
	// partitions are done. Zero makes Open fail instead.
	RetryEvery time.Duration
	// Logger receives the failures of the attempts of RetryEvery (the
	// first, then one every 30s) and their success; nil discards them.
	Logger *slog.Logger
}

// ErrNotReady is the error of Write, Query and Partitions on a Store that
// has not yet migrated PostgreSQL (see Config.RetryEvery).
var ErrNotReady = errors.New("pganalytics: PostgreSQL not migrated yet (not reachable since the start)")

// retryLogEvery is how often a Store that cannot set PostgreSQL up logs
// that it still cannot, after the first failure.
const retryLogEvery = 30 * time.Second

// Store writes and queries analytics in PostgreSQL. It is safe for
// concurrent use; Close stops its background upkeep.
type Store struct {
	cfg  Config
	pool *pgxpool.Pool

	mu   sync.Mutex
	days map[int64]bool // guarded by mu; UTC days (Unix/86400) known to have partitions

	ready atomic.Bool // the schema is migrated and today's partitions made

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Open connects to PostgreSQL, migrates the schema, creates the partitions
// and starts the upkeep. PostgreSQL must be up for Open unless
// Config.RetryEvery is set; after it, the Store rides out outages.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	if cfg.DaysAhead <= 0 {
		cfg.DaysAhead = 3
	}
	if cfg.MaintainInterval <= 0 {
		cfg.MaintainInterval = time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("pganalytics: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("pganalytics: %w", err)
	}
	s := &Store{cfg: cfg, pool: pool, days: map[int64]bool{}}
	err = s.setUp(ctx)
	if err != nil && cfg.RetryEvery <= 0 {
		pool.Close()
		return nil, err
	}
	bg, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Go(func() {
		if err != nil && !s.retrySetUp(bg, err) {
			return
		}
		s.upkeep(bg)
	})
	return s, nil
}

// setUp migrates the schema and creates the partitions; then the Store is
// ready.
func (s *Store) setUp(ctx context.Context) error {
	if _, err := Migrate(ctx, s.pool); err != nil {
		return err
	}
	if err := s.maintain(ctx, s.cfg.Now()); err != nil {
		return err
	}
	s.ready.Store(true)
	return nil
}

// retrySetUp calls setUp every RetryEvery until it succeeds (true) or ctx
// ends (false). first is the failure of Open's attempt.
func (s *Store) retrySetUp(ctx context.Context, first error) bool {
	log := s.cfg.Logger
	log.Warn("analytics: PostgreSQL cannot be set up; the analytics stay in memory until it can", "err", first)
	since, logged := time.Now(), time.Now()
	t := time.NewTicker(s.cfg.RetryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		actx, cancel := context.WithTimeout(ctx, max(s.cfg.RetryEvery, 10*time.Second))
		err := s.setUp(actx)
		cancel()
		if err == nil {
			log.Info("analytics: PostgreSQL migrated; writing the analytics there", "after", time.Since(since).Round(time.Millisecond))
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if time.Since(logged) >= retryLogEvery {
			log.Warn("analytics: PostgreSQL still cannot be set up", "for", time.Since(since).Round(time.Second), "err", err)
			logged = time.Now()
		}
	}
}

// upkeep runs Maintain every MaintainInterval until ctx ends.
func (s *Store) upkeep(ctx context.Context) {
	t := time.NewTicker(s.cfg.MaintainInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A failure is retried at the next tick; Write creates the
			// partitions it needs meanwhile.
			s.Maintain(ctx, s.cfg.Now())
		}
	}
}

// Ready reports whether the Store has migrated PostgreSQL: always once
// Open has returned without Config.RetryEvery.
func (s *Store) Ready() bool { return s.ready.Load() }

// Close stops the upkeep and closes the connections.
func (s *Store) Close() {
	s.cancel()
	s.wg.Wait()
	s.pool.Close()
}

// tables are the partitioned tables.
var tables = []string{"analytics_rollups", "analytics_blocked_events", "analytics_hourly", "analytics_client_days", "analytics_client_hours",
	"analytics_changes", "analytics_anomalies"}

// Maintain creates the partitions of yesterday, today and the days ahead,
// and drops those older than the retention before now. It fails with
// ErrNotReady before the Store has migrated PostgreSQL.
func (s *Store) Maintain(ctx context.Context, now time.Time) error {
	if !s.ready.Load() {
		return ErrNotReady
	}
	return s.maintain(ctx, now)
}

// maintain is Maintain without its check of readiness.
func (s *Store) maintain(ctx context.Context, now time.Time) error {
	today := now.UTC().Truncate(24 * time.Hour)
	from := today.AddDate(0, 0, -1)
	cutoff := now.Add(-s.cfg.Retention).UTC().Truncate(24 * time.Hour)
	for _, t := range tables {
		if _, err := s.pool.Exec(ctx, "SELECT analytics_ensure_partitions($1, $2, $3)", t, from, s.cfg.DaysAhead+2); err != nil {
			return fmt.Errorf("pganalytics: create partitions: %w", err)
		}
		if _, err := s.pool.Exec(ctx, "SELECT analytics_drop_partitions($1, $2)", t, cutoff); err != nil {
			return fmt.Errorf("pganalytics: drop partitions: %w", err)
		}
	}
	s.mu.Lock()
	clear(s.days) // dropped days must be created again if rows come for them
	s.mu.Unlock()
	return nil
}

// ensureDays creates, within tx, the partitions of the days of rollups
// and events not known to exist.
func (s *Store) ensureDays(ctx context.Context, tx pgx.Tx, rs []analytics.Rollup, evs []analytics.Event) ([]int64, error) {
	unix := make([]int64, 0, len(rs)+len(evs))
	for i := range rs {
		unix = append(unix, rs[i].Minute)
	}
	for i := range evs {
		unix = append(unix, evs[i].Time.Unix())
	}
	return s.ensureUnix(ctx, tx, unix)
}

// ensureUnix creates, within tx, the partitions of the days of the Unix
// times not known to exist, and returns those days.
func (s *Store) ensureUnix(ctx context.Context, tx pgx.Tx, unix []int64) ([]int64, error) {
	var missing []int64
	s.mu.Lock()
	seen := map[int64]bool{}
	for _, u := range unix {
		d := u / 86400
		if !s.days[d] && !seen[d] {
			seen[d] = true
			missing = append(missing, d)
		}
	}
	s.mu.Unlock()
	for _, d := range missing {
		day := time.Unix(d*86400, 0).UTC()
		for _, t := range tables {
			if _, err := tx.Exec(ctx, "SELECT analytics_ensure_partitions($1, $2, 1)", t, day); err != nil {
				return nil, err
			}
		}
	}
	return missing, nil
}

// Write stores rollups and blocked events in one transaction, with COPY.
// Rows older than the retention are left out: their partitions are gone.
// It is the analytics.Sink method. It fails with ErrNotReady before the
// Store has migrated PostgreSQL.
func (s *Store) Write(ctx context.Context, rs []analytics.Rollup, blocked []analytics.Event) error {
	if !s.ready.Load() {
		return ErrNotReady
	}
	cutoff := s.cfg.Now().Add(-s.cfg.Retention).UTC().Truncate(24 * time.Hour).Unix()
	rs = keepRollups(rs, cutoff)
	blocked = keepEvents(blocked, cutoff)
	if len(rs) == 0 && len(blocked) == 0 {
		return nil
	}
	return twice(ctx, func() error { return s.write(ctx, rs, blocked) })
}

// twice runs attempt, a transaction, and once more if it failed while ctx
// is live. A transaction that failed left nothing behind, so it can run
// again; once, because after PostgreSQL restarted the pool's first
// connection is found dead only when used.
func twice(ctx context.Context, attempt func() error) error {
	err := attempt()
	if err != nil && ctx.Err() == nil {
		err = attempt()
	}
	if err != nil {
		return fmt.Errorf("pganalytics: write: %w", err)
	}
	return nil
}

// write is one attempt of Write.
func (s *Store) write(ctx context.Context, rs []analytics.Rollup, blocked []analytics.Event) error {
	var created []int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if created, err = s.ensureDays(ctx, tx, rs, blocked); err != nil {
			return err
		}
		if len(rs) > 0 {
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"analytics_rollups"},
				[]string{"minute", "client", "resource", "region", "blocked", "requests", "cost", "latency_sum_us", "latency_buckets"},
				&rollupRows{rs: rs, i: -1}); err != nil {
				return err
			}
		}
		if err := copyCoarse(ctx, tx, rs); err != nil {
			return err
		}
		if len(blocked) > 0 {
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"analytics_blocked_events"},
				[]string{"at", "client", "resource", "region", "rule", "reason", "cost", "latency_us"},
				&eventRows{evs: blocked, i: -1}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, d := range created {
		s.days[d] = true
	}
	s.mu.Unlock()
	return nil
}

func keepRollups(rs []analytics.Rollup, cutoff int64) []analytics.Rollup {
	for i := range rs {
		if rs[i].Minute < cutoff {
			out := append([]analytics.Rollup(nil), rs[:i]...)
			for j := i + 1; j < len(rs); j++ {
				if rs[j].Minute >= cutoff {
					out = append(out, rs[j])
				}
			}
			return out
		}
	}
	return rs
}

func keepEvents(evs []analytics.Event, cutoff int64) []analytics.Event {
	for i := range evs {
		if evs[i].Time.Unix() < cutoff {
			out := append([]analytics.Event(nil), evs[:i]...)
			for j := i + 1; j < len(evs); j++ {
				if evs[j].Time.Unix() >= cutoff {
					out = append(out, evs[j])
				}
			}
			return out
		}
	}
	return evs
}

// rollupRows feeds rollups to CopyFrom.
type rollupRows struct {
	rs      []analytics.Rollup
	i       int
	buckets [analytics.SketchBuckets]int64
}

func (r *rollupRows) Next() bool { r.i++; return r.i < len(r.rs) }
func (r *rollupRows) Err() error { return nil }
func (r *rollupRows) Values() ([]any, error) {
	ro := &r.rs[r.i]
	for j, c := range ro.Latency {
		r.buckets[j] = int64(c)
	}
	return []any{time.Unix(ro.Minute, 0).UTC(), ro.Client, ro.Resource, ro.Region, ro.Blocked,
		ro.Requests, ro.Cost, ro.LatencySumUS, r.buckets[:]}, nil
}

// eventRows feeds blocked events to CopyFrom.
type eventRows struct {
	evs []analytics.Event
	i   int
}

func (r *eventRows) Next() bool { r.i++; return r.i < len(r.evs) }
func (r *eventRows) Err() error { return nil }
func (r *eventRows) Values() ([]any, error) {
	e := &r.evs[r.i]
	return []any{e.Time.UTC(), e.Client, e.Resource, e.Region, e.Rule, e.Reason, e.Cost, e.Latency.Microseconds()}, nil
}

// errSketch is returned when a stored sketch does not have the expected
// number of buckets.
var errSketch = errors.New("pganalytics: stored latency sketch of the wrong size")
