package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/analytics/pganalytics"
	"github.com/sluicehq/sluice/internal/daemon"
)

// analyticsFlags are serve's flags of the analytics.
type analyticsFlags struct {
	URL           string        `name:"analytics" placeholder:"URL" env:"SLUICE_ANALYTICS" help:"PostgreSQL for the analytics, postgres://user:password@host:5432/db: migrated at start, written every flush interval, answered from at GET /api/v1/analytics; empty: the in-process store of the last 24 hours only"`
	Retention     time.Duration `name:"analytics-retention" default:"${analytics_retention}" env:"SLUICE_ANALYTICS_RETENTION" help:"how long PostgreSQL keeps the analytics (whole days are dropped, hourly)"`
	FlushInterval time.Duration `name:"analytics-flush-interval" default:"10s" env:"SLUICE_ANALYTICS_FLUSH_INTERVAL" help:"how often the analytics are written to PostgreSQL"`
	Off           bool          `name:"no-analytics" env:"SLUICE_NO_ANALYTICS" help:"record no analytics (GET /api/v1/analytics and include_history answer 404 and 400)"`
}

// fill sets the analytics' fields of cfg.
func (f *analyticsFlags) fill(cfg *daemon.Config) {
	cfg.AnalyticsURL, cfg.AnalyticsRetention, cfg.AnalyticsFlushInterval, cfg.NoAnalytics = f.URL, f.Retention, f.FlushInterval, f.Off
}

// migrateCmd brings the analytics schema of a PostgreSQL to this build's
// version, as serve does at start, and prints the versions applied.
type migrateCmd struct {
	Analytics string        `name:"analytics" placeholder:"URL" required:"" env:"SLUICE_ANALYTICS" help:"the PostgreSQL to migrate, postgres://user:password@host:5432/db"`
	Timeout   time.Duration `name:"timeout" default:"1m0s" env:"SLUICE_MIGRATE_TIMEOUT" help:"how long the migration may take"`
}

func (c *migrateCmd) run(inv *invocation) int {
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	applied, err := pganalytics.MigrateURL(ctx, c.Analytics)
	if err != nil {
		fmt.Fprintf(inv.stderr, "sluice migrate: %v\n", err)
		return 1
	}
	if len(applied) == 0 {
		fmt.Fprintln(inv.stdout, "the analytics schema is current")
		return 0
	}
	fmt.Fprintf(inv.stdout, "applied migrations %v\n", applied)
	return 0
}
