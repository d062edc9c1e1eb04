//go:build race

package daemon_test

// raceEnabled reports a build with the race detector, which slows every
// instance several times: latency bounds are then reported, not asserted.
const raceEnabled = true
