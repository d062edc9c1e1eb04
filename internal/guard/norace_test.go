//go:build !race

package guard_test

import "time"

// faultDeadline is the guard's deadline in the fault tests (see the race
// build's, which is longer). The tests' bounds are derived from it.
const faultDeadline = 5 * time.Millisecond

// attackerP99Ratio bounds the other clients' p99 with an attacker over
// their p99 without it (see the race build's). Without the race detector
// the attacker's work weighs more beside the others'. The attacker's
// answers are reused, as the HTTP, gRPC and Envoy APIs reuse them, and
// cause no garbage collection (13 to 27 a second when each request
// allocated its answer). Measured in 16 runs on two cores, at a load
// average of 4 to 13, alternating with runs of the code before it reused
// them: batches of 50 0.8 to 17 (median 2.1; before, 1.9 to 6.7, median
// 4.2), of 1,000 1.1 to 8.9 (2.0; before, 1.8 to 11, 5.8), Envoy requests
// 1.1 to 23 (2.4; before, 2.4 to 9.6, 5.7). The outliers are
// runs in which the machine stalled the process for hundreds of
// milliseconds: at such a load the test fails at times.
const attackerP99Ratio = 5.0
