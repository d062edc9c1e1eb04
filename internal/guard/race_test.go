//go:build race

package guard_test

import "time"

// faultDeadline is the guard's deadline in the fault tests. The race
// detector slows every call several times, and on two cores busy with
// other packages' tests a call through it misses 5ms more often than not:
// the breaker then never closes. The tests' bounds are derived from it.
const faultDeadline = 15 * time.Millisecond
