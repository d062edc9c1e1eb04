//go:build !race

package globalsync

import "time"

// latencySlack is what the latency bounds of the cross-region test allow
// beyond twice the reference (see race_test.go).
const latencySlack = 5 * time.Millisecond
