//go:build race

package globalsync

import "time"

// latencySlack is what the latency bounds of the cross-region test allow
// beyond twice the reference. The race detector slows every check several
// times, and with the other packages' tests on the same two cores a
// single stall of a few tens of milliseconds lands in a p99 of a few
// hundred checks.
const latencySlack = 30 * time.Millisecond
