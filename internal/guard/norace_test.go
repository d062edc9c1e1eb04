//go:build !race

package guard_test

import "time"

// faultDeadline is the guard's deadline in the fault tests (see the race
// build's, which is longer). The tests' bounds are derived from it.
const faultDeadline = 5 * time.Millisecond

// attackerP99Ratio bounds the other clients' p99 with the batch attacker
// over their p99 without it (see the race build's, which is looser).
const attackerP99Ratio = 2.0
