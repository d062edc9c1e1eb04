//go:build !race

package guard_test

import "time"

// faultDeadline is the guard's deadline in the fault tests (see the race
// build's, which is longer). The tests' bounds are derived from it.
const faultDeadline = 5 * time.Millisecond

// attackerP99Ratio bounds the other clients' p99 with an attacker over
// their p99 without it (see the race build's). Without the race detector
// the attacker's work weighs more beside the others': measured at a load
// average of 16 to 27 on two cores, 1.9 to 7.6 (once 12; without the bulk
// share 7 to 185), so that at such a load the test fails at times.
// Garbage collection is most of the excess: the attacker's allocations
// cause 13 to 40 collections a second, none without it, and with GOGC=off
// the same windows measured 0.6 to 3.1 (load 8 to 12).
const attackerP99Ratio = 5.0
