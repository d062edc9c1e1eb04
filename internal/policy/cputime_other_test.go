//go:build !unix

package policy

import "time"

// processCPU reports false: the CPU time of the process is read on Unix
// only.
func processCPU() (time.Duration, bool) { return 0, false }
