//go:build !race

package guard_test

import "time"

// faultDeadline is the guard's deadline in the fault tests (see the race
// build's, which is longer). The tests' bounds are derived from it.
const faultDeadline = 5 * time.Millisecond
