// Package bench holds Sluice's benchmarks against other rate-limiting
// libraries and Redis clients, and its cold-start benchmark; package
// migrate measures its migration runner against goose. It is a module of
// its own, so that the main module does not depend on the libraries it is
// compared with, nor on its load generator: package loadgen and the
// sluice-load binary (cmd/sluice-load), with the reference server of the
// load runs (cmd/noop). Every benchmark is in a _test.go file;
// docs/PERFORMANCE.md gives the commands and the figures measured.
package bench
