package algorithm

import "github.com/sluicehq/sluice"

// State is the state of one key for every algorithm but the sliding window
// log. Its zero value is the state of a key never seen, which is also the
// state of a key whose limit is fully restored. What A, B and C hold depends
// on the algorithm (see the package documentation).
type State struct {
	A, B, C int64
}

// Apply decides a request of cost units at now (microseconds since the Unix
// epoch) against state s, and returns the new state and the decision. It is
// a pure function: no locks, no I/O, no clock. When the request is denied,
// or cost is 0, the returned state decides every later request as s would.
// cost must not be negative. Apply does not handle SlidingWindowLog (see
// ApplyLog).
func Apply(p *Params, s State, now, cost int64) (State, sluice.Decision) {
	panic("algorithm: not implemented")
}

// ApplyLog decides a request for the sliding window log. log holds the
// admission instants in quanta, oldest first, one entry per unit of cost
// admitted; entries older than the window may be present and are dropped.
// It returns the new log, which may share log's array, and the decision.
func ApplyLog(p *Params, log []int64, now, cost int64) ([]int64, sluice.Decision) {
	panic("algorithm: not implemented")
}

// ExpiresAt returns the instant, in microseconds since the Unix epoch, from
// which s is equivalent to the zero State under p, so a store may forget
// it. For the sliding window log, pass the newest entry of the log in s.A.
func ExpiresAt(p *Params, s State) int64 {
	panic("algorithm: not implemented")
}
