package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice/internal/analytics/pganalytics"
	"github.com/sluicehq/sluice/internal/daemon"
)

// analyticsFlags defines serve's flags of the analytics; the function it
// returns fills them into cfg.
func analyticsFlags(fs *flag.FlagSet) func(cfg *daemon.Config) {
	url := fs.String("analytics", "", "PostgreSQL for the analytics, postgres://user:password@host:5432/db: migrated at start, written every flush interval, answered from at GET /api/v1/analytics; empty: the in-process store of the last 24 hours only")
	retention := fs.Duration("analytics-retention", daemon.DefaultAnalyticsRetention, "how long PostgreSQL keeps the analytics (whole days are dropped, hourly)")
	flush := fs.Duration("analytics-flush-interval", 10*time.Second, "how often the analytics are written to PostgreSQL")
	off := fs.Bool("no-analytics", false, "record no analytics (GET /api/v1/analytics and include_history answer 404 and 400)")
	return func(cfg *daemon.Config) {
		cfg.AnalyticsURL, cfg.AnalyticsRetention, cfg.AnalyticsFlushInterval, cfg.NoAnalytics = *url, *retention, *flush, *off
	}
}

const migrateUsage = "Usage: sluice migrate --analytics postgres://user:password@host:5432/db\n"

// migrate brings the analytics schema of a PostgreSQL to this build's
// version, as serve does at start, and prints the versions applied.
func migrate(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("analytics", "", "the PostgreSQL to migrate")
	timeout := fs.Duration("timeout", time.Minute, "how long the migration may take")
	fs.Usage = func() { fmt.Fprint(fs.Output(), migrateUsage, "\nFlags:\n"); fs.PrintDefaults() }
	fromEnv := envFlags(fs, commandEnv(fs, "migrate", map[string]string{"analytics": "SLUICE_ANALYTICS"}))
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if err := fromEnv(getenv); err != nil {
		fmt.Fprintf(stderr, "sluice migrate: %v\n", err)
		return 2
	}
	if *url == "" || fs.NArg() > 0 {
		fmt.Fprint(stderr, migrateUsage)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	applied, err := pganalytics.MigrateURL(ctx, *url)
	if err != nil {
		fmt.Fprintf(stderr, "sluice migrate: %v\n", err)
		return 1
	}
	if len(applied) == 0 {
		fmt.Fprintln(stdout, "the analytics schema is current")
		return 0
	}
	fmt.Fprintf(stdout, "applied migrations %v\n", applied)
	return 0
}
