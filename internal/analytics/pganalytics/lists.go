package pganalytics

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/analytics"
)

// WriteLists stores changes and anomalies in one transaction, with COPY
// (migration 0006). Rows older than the retention are left out. It is the
// analytics.ListSink method. It fails with ErrNotReady before the Store
// has migrated PostgreSQL.
func (s *Store) WriteLists(ctx context.Context, changes []analytics.Change, anomalies []analytics.Anomaly) error {
	if !s.ready.Load() {
		return ErrNotReady
	}
	cutoff := s.cfg.Now().Add(-s.cfg.Retention).UTC().Truncate(24 * time.Hour).Unix()
	var cs []analytics.Change
	for _, c := range changes {
		if c.Time.Unix() >= cutoff {
			cs = append(cs, c)
		}
	}
	var as []analytics.Anomaly
	for _, a := range anomalies {
		if a.Minute >= cutoff {
			as = append(as, a)
		}
	}
	if len(cs) == 0 && len(as) == 0 {
		return nil
	}
	return twice(ctx, func() error { return s.writeLists(ctx, cs, as) })
}

// writeLists is one attempt of WriteLists.
func (s *Store) writeLists(ctx context.Context, cs []analytics.Change, as []analytics.Anomaly) error {
	unix := make([]int64, 0, len(cs)+len(as))
	changeRows := make([][]any, 0, len(cs))
	for _, c := range cs {
		unix = append(unix, c.Time.Unix())
		changeRows = append(changeRows, []any{c.Time.UTC(), c.Kind, c.Detail})
	}
	anomalyRows := make([][]any, 0, len(as))
	for _, a := range as {
		unix = append(unix, a.Minute)
		anomalyRows = append(anomalyRows, []any{time.Unix(a.Minute, 0).UTC(), a.Kind, a.Client, a.Resource, a.Region, a.Observed, a.Baseline})
	}
	var created []int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if created, err = s.ensureUnix(ctx, tx, unix); err != nil {
			return err
		}
		if len(changeRows) > 0 {
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"analytics_changes"},
				[]string{"at", "kind", "detail"}, pgx.CopyFromRows(changeRows)); err != nil {
				return err
			}
		}
		if len(anomalyRows) > 0 {
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"analytics_anomalies"},
				[]string{"minute", "kind", "client", "resource", "region", "observed", "baseline"}, pgx.CopyFromRows(anomalyRows)); err != nil {
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

// The newest changes and anomalies of a range, up to MaxListed of each.
// Changes are not narrowed by client, resource or region; anomalies are,
// with conditions added only for the filters given, as rollupQuery does.
const (
	queryChanges = `
SELECT at, kind, detail FROM analytics_changes
WHERE at >= $1 AND at < $2
ORDER BY at DESC LIMIT $3`
	queryAnomalies = `
SELECT extract(epoch FROM minute)::bigint, kind, client, resource, region, observed, baseline
FROM analytics_anomalies
WHERE minute >= $1 AND minute < $2`
)

// queryLists returns the newest changes and anomalies f selects.
func (s *Store) queryLists(ctx context.Context, f *analytics.Filter) ([]analytics.Change, []analytics.Anomaly, error) {
	rows, err := s.pool.Query(ctx, queryChanges, f.Start.UTC(), f.End.UTC(), analytics.MaxListed)
	if err != nil {
		return nil, nil, err
	}
	var cs []analytics.Change
	for rows.Next() {
		var c analytics.Change
		if err := rows.Scan(&c.Time, &c.Kind, &c.Detail); err != nil {
			rows.Close()
			return nil, nil, err
		}
		c.Time = c.Time.UTC()
		cs = append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	q, args := queryAnomalies, []any{f.Start.UTC(), f.End.UTC()}
	for _, c := range []struct{ sql, val string }{{whereClient, f.Client}, {whereResource, f.Resource}, {whereRegion, f.Region}} {
		if c.val != "" {
			args = append(args, c.val)
			q += c.sql + strconv.Itoa(len(args))
		}
	}
	args = append(args, analytics.MaxListed)
	q += " ORDER BY minute DESC LIMIT $" + strconv.Itoa(len(args))
	if rows, err = s.pool.Query(ctx, q, args...); err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var as []analytics.Anomaly
	for rows.Next() {
		var a analytics.Anomaly
		if err := rows.Scan(&a.Minute, &a.Kind, &a.Client, &a.Resource, &a.Region, &a.Observed, &a.Baseline); err != nil {
			return nil, nil, err
		}
		as = append(as, a)
	}
	return cs, as, rows.Err()
}
