// Package migrate measures Sluice's migration runner
// (internal/analytics/pganalytics) against pressly/goose's Provider on the
// same embedded SQL files and a real PostgreSQL (internal/analytics/pgtest,
// one server for the package, a new database per run): the time to
// migrate an empty database, the time of a run with nothing to do, two
// instances starting at once, a failed migration, and what each adds to a
// binary. Only this module depends on goose; docs/PERFORMANCE.md gives
// the command and the figures.
package migrate
