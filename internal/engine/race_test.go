//go:build race

package engine

// raceEnabled reports a build with the race detector, under which
// sync.Pool drops a share of what is put back at random, so that counts of
// allocations vary from run to run.
const raceEnabled = true
