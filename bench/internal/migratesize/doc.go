// Package migratesize holds the three smallest commands that migrate a
// PostgreSQL database, built by bench/migrate's size benchmark so that it
// can tell what each way of migrating adds to a binary: pgx connects and
// runs one statement (the reference), sluice runs Sluice's own runner
// (pganalytics.MigrateURL), goose runs pressly/goose's Provider over pgx's
// database/sql driver.
package migratesize
