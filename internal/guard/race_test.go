//go:build race

package guard_test

import "time"

// faultDeadline is the guard's deadline in the fault tests. The race
// detector slows every call several times, and on two cores busy with
// other packages' tests a call through it misses 5ms more often than not:
// the breaker then never closes. The tests' bounds are derived from it.
const faultDeadline = 15 * time.Millisecond

// attackerP99Ratio bounds the other clients' p99 with the batch attacker
// over their p99 without it. The race detector slows the attacker's
// planning several times, and its slices with it; about half of its CPU
// goes to the detector's own work, which the Go scheduler does not see.
const attackerP99Ratio = 4.0
