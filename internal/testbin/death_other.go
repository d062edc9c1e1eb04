//go:build !linux

package testbin

import "os/exec"

// DieWithParent is a no-op where the system cannot tie a process's life to
// its parent's; TestMain functions stop the servers they start.
func DieWithParent(cmd *exec.Cmd) {}
