package testbin

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the process cmd starts receive SIGKILL when the test
// process that started it dies, however it dies (a panic, a timeout, a
// kill), so that no test server outlives its test run.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
