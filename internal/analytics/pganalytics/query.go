package pganalytics

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

// queryRollups selects the rollups of a time range; whereClient,
// whereResource and whereRegion narrow it. Every value is a parameter. The
// conditions are left out rather than written "($3 = ” OR client = $3)",
// which a generic plan of the prepared statement could not answer from the
// index on (client, minute).
const (
	queryRollups = `
SELECT extract(epoch FROM minute)::bigint, client, resource, region, blocked,
       requests, cost, latency_sum_us, latency_buckets
FROM analytics_rollups
WHERE minute >= $1 AND minute < $2`
	whereClient   = ` AND client = $`
	whereResource = ` AND resource = $`
	whereRegion   = ` AND region = $`
)

// rollupQuery returns the SQL and the arguments that select f's rollups.
func rollupQuery(f *analytics.Filter) (string, []any) {
	q, args := queryRollups, []any{f.Start.UTC(), f.End.UTC()}
	for _, c := range []struct{ sql, val string }{{whereClient, f.Client}, {whereResource, f.Resource}, {whereRegion, f.Region}} {
		if c.val != "" {
			args = append(args, c.val)
			q += c.sql + strconv.Itoa(len(args))
		}
	}
	return q, args
}

// Query sums the rollups f selects, with the same answer as the in-process
// store for the same rollups.
func (s *Store) Query(ctx context.Context, f analytics.Filter) (analytics.Result, error) {
	if err := f.Validate(); err != nil {
		return analytics.Result{}, err
	}
	if !s.ready.Load() {
		return analytics.Result{}, ErrNotReady
	}
	cs, as, err := s.queryLists(ctx, &f)
	if err != nil {
		return analytics.Result{}, fmt.Errorf("pganalytics: query: %w", err)
	}
	if coarse(&f) {
		return s.queryCoarse(ctx, f, cs, as)
	}
	q, args := rollupQuery(&f)
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return analytics.Result{}, fmt.Errorf("pganalytics: query: %w", err)
	}
	defer rows.Close()
	acc := analytics.NewAccumulator(f)
	acc.Changes, acc.Anomalies = cs, as
	var (
		r       analytics.Rollup
		buckets []int64
	)
	for rows.Next() {
		if err := rows.Scan(&r.Minute, &r.Client, &r.Resource, &r.Region, &r.Blocked,
			&r.Requests, &r.Cost, &r.LatencySumUS, &buckets); err != nil {
			return analytics.Result{}, fmt.Errorf("pganalytics: query: %w", err)
		}
		if len(buckets) != analytics.SketchBuckets {
			return analytics.Result{}, errSketch
		}
		for i, c := range buckets {
			r.Latency[i] = uint32(c)
		}
		acc.Add(&r)
	}
	if err := rows.Err(); err != nil {
		return analytics.Result{}, fmt.Errorf("pganalytics: query: %w", err)
	}
	return acc.Result(), nil
}

// Partitions returns the days that have a partition of the rollups table,
// oldest first.
func (s *Store) Partitions(ctx context.Context) ([]time.Time, error) {
	if !s.ready.Load() {
		return nil, ErrNotReady
	}
	rows, err := s.pool.Query(ctx, `
		SELECT to_date(substring(c.relname FROM '[0-9]{8}$'), 'YYYYMMDD')
		FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = $1
		ORDER BY 1`, "analytics_rollups")
	if err != nil {
		return nil, fmt.Errorf("pganalytics: partitions: %w", err)
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var d time.Time
		if err := rows.Scan(&d); err != nil {
			return nil, err
		}
		out = append(out, d.UTC())
	}
	return out, rows.Err()
}
