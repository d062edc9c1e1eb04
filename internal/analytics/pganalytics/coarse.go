package pganalytics

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/analytics"
)

// The coarse tables (migrations 0004 and 0005) hold the rollups again,
// summed by hour without the client (analytics_hourly), and by day and by
// hour without the latencies (analytics_client_days, analytics_client_hours).
// A query of every client over whole hours reads them instead of the
// rollups: a month of 10,000 clients is then a few thousand hourly rows, a
// row per client, day, resource, region and outcome, and the hours of the
// first and last days, instead of a row per client and minute.

// hourKey identifies a row of analytics_hourly.
type hourKey struct {
	hour             int64
	resource, region string
	blocked          bool
}

// dayKey identifies a row of analytics_client_days or, by hour,
// analytics_client_hours.
type dayKey struct {
	day                      int64
	client, resource, region string
	blocked                  bool
}

// copyCoarse sums rs into the coarse tables' rows and copies them, within
// tx.
func copyCoarse(ctx context.Context, tx pgx.Tx, rs []analytics.Rollup) error {
	if len(rs) == 0 {
		return nil
	}
	hours := map[hourKey]*analytics.Rollup{}
	days, clientHours := map[dayKey]int64{}, map[dayKey]int64{}
	for i := range rs {
		r := &rs[i]
		hk := hourKey{r.Minute - mod(r.Minute, 3600), r.Resource, r.Region, r.Blocked}
		h := hours[hk]
		if h == nil {
			h = &analytics.Rollup{Key: analytics.Key{Minute: hk.hour, Resource: r.Resource, Region: r.Region, Blocked: r.Blocked}}
			hours[hk] = h
		}
		h.Requests += r.Requests
		h.Cost += r.Cost
		h.LatencySumUS += r.LatencySumUS
		h.Latency.Merge(&r.Latency)
		days[dayKey{r.Minute - mod(r.Minute, 86400), r.Client, r.Resource, r.Region, r.Blocked}] += r.Requests
		clientHours[dayKey{hk.hour, r.Client, r.Resource, r.Region, r.Blocked}] += r.Requests
	}
	hourly := make([]analytics.Rollup, 0, len(hours))
	for _, h := range hours {
		hourly = append(hourly, *h)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"analytics_hourly"},
		[]string{"hour", "resource", "region", "blocked", "requests", "cost", "latency_sum_us", "latency_buckets"},
		&hourlyRows{rollupRows{rs: hourly, i: -1}}); err != nil {
		return err
	}
	for _, t := range []struct {
		table, column string
		rows          map[dayKey]int64
	}{{"analytics_client_days", "day", days}, {"analytics_client_hours", "hour", clientHours}} {
		rows := make([][]any, 0, len(t.rows))
		for k, n := range t.rows {
			rows = append(rows, []any{time.Unix(k.day, 0).UTC(), k.client, k.resource, k.region, k.blocked, n})
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{t.table},
			[]string{t.column, "client", "resource", "region", "blocked", "requests"}, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
	}
	return nil
}

// hourlyRows feeds hourly rollups to CopyFrom: a rollup's columns without
// the client.
type hourlyRows struct{ rollupRows }

func (r *hourlyRows) Values() ([]any, error) {
	v, err := r.rollupRows.Values()
	if err != nil {
		return nil, err
	}
	return append(v[:1:1], v[2:]...), nil
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// coarse reports whether f may be answered from the coarse tables: every
// client, points of hours or days, and a range of whole UTC hours.
func coarse(f *analytics.Filter) bool {
	return f.Client == "" && f.Granularity != analytics.Minute &&
		mod(f.Start.Unix(), 3600) == 0 && f.Start.Nanosecond() == 0 &&
		mod(f.End.Unix(), 3600) == 0 && f.End.Nanosecond() == 0
}

// filterSQL returns the conditions of f's resource and region, as
// parameters after args, and args with their values.
func filterSQL(args []any, f *analytics.Filter) (string, []any) {
	var q string
	for _, c := range []struct{ sql, val string }{{whereResource, f.Resource}, {whereRegion, f.Region}} {
		if c.val != "" {
			args = append(args, c.val)
			q += c.sql + strconv.Itoa(len(args))
		}
	}
	return q, args
}

// queryCoarse answers f from the coarse tables; f must pass coarse.
func (s *Store) queryCoarse(ctx context.Context, f analytics.Filter, cs []analytics.Change, as []analytics.Anomaly) (analytics.Result, error) {
	where, args := filterSQL([]any{f.Start.UTC(), f.End.UTC()}, &f)
	rows, err := s.pool.Query(ctx, `
SELECT extract(epoch FROM hour)::bigint, resource, region, blocked, requests, cost, latency_sum_us, latency_buckets
FROM analytics_hourly WHERE hour >= $1 AND hour < $2`+where, args...)
	if err != nil {
		return analytics.Result{}, fmt.Errorf("pganalytics: query: %w", err)
	}
	acc := analytics.NewAccumulator(f)
	acc.Changes, acc.Anomalies = cs, as
	var r analytics.Rollup
	var buckets []int64
	for rows.Next() {
		if err := rows.Scan(&r.Minute, &r.Resource, &r.Region, &r.Blocked, &r.Requests, &r.Cost, &r.LatencySumUS, &buckets); err != nil {
			rows.Close()
			return analytics.Result{}, fmt.Errorf("pganalytics: query: %w", err)
		}
		if len(buckets) != analytics.SketchBuckets {
			rows.Close()
			return analytics.Result{}, errSketch
		}
		for i, c := range buckets {
			r.Latency[i] = uint32(c)
		}
		acc.Add(&r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return analytics.Result{}, fmt.Errorf("pganalytics: query: %w", err)
	}
	res := acc.Result()
	if res.TopClients, err = s.topClients(ctx, f); err != nil {
		return analytics.Result{}, err
	}
	return res, nil
}

// topClients returns the clients most blocked within f, as
// analytics.Accumulator ranks them: the whole days of f's range from
// analytics_client_days, the hours before the first and after the last
// from analytics_client_hours.
func (s *Store) topClients(ctx context.Context, f analytics.Filter) ([]analytics.Top, error) {
	n := f.Top
	if n <= 0 {
		n = 10
	}
	// The whole days [first, last); none when the range holds no whole day.
	start, end := f.Start.UTC(), f.End.UTC()
	first, last := start.Truncate(24*time.Hour), end.Truncate(24*time.Hour)
	if first.Before(start) {
		first = first.Add(24 * time.Hour)
	}
	if !first.Before(last) {
		first, last = end, end
	}
	where, args := filterSQL([]any{first, last, start, end}, &f)
	args = append(args, n)
	q := `
SELECT client, sum(requests) FILTER (WHERE blocked), sum(requests) FROM (
  SELECT client, blocked, requests FROM analytics_client_days WHERE day >= $1 AND day < $2` + where + `
  UNION ALL
  SELECT client, blocked, requests FROM analytics_client_hours
  WHERE (hour >= $3 AND hour < $1 OR hour >= $2 AND hour < $4)` + where + `
) x GROUP BY client HAVING sum(requests) FILTER (WHERE blocked) > 0
ORDER BY 2 DESC, client COLLATE "C" LIMIT $` + strconv.Itoa(len(args))
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("pganalytics: query: %w", err)
	}
	defer rows.Close()
	var out []analytics.Top
	for rows.Next() {
		var t analytics.Top
		if err := rows.Scan(&t.Name, &t.Blocked, &t.Total); err != nil {
			return nil, fmt.Errorf("pganalytics: query: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pganalytics: query: %w", err)
	}
	// The database's order already; sorted again so that the answer never
	// depends on its collation.
	slices.SortStableFunc(out, func(x, y analytics.Top) int {
		if c := cmp.Compare(y.Blocked, x.Blocked); c != 0 {
			return c
		}
		return cmp.Compare(x.Name, y.Name)
	})
	return out, nil
}
