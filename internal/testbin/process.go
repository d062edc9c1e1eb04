package testbin

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a server started by a test: a binary of a tools module that
// prints "ready" on its standard output once it serves.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start runs bin with args and waits up to wait for its "ready" line. name
// names the server in errors.
func Start(name, bin string, args []string, wait time.Duration) (*Process, error) {
	cmd := exec.Command(bin, args...)
	DieWithParent(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "ready" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	select {
	case ok := <-ready:
		if !ok {
			<-exited
			return nil, fmt.Errorf("%s exited at start: %s", name, stderr.String())
		}
	case <-time.After(wait):
		cmd.Process.Kill()
		<-exited
		return nil, fmt.Errorf("%s not ready after %s", name, wait)
	}
	return &Process{cmd: cmd, exited: exited}, nil
}

// Stop stops the process: SIGTERM, then SIGKILL after 10s.
func (p *Process) Stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Kill kills the process (SIGKILL), as a crash would.
func (p *Process) Kill() {
	p.cmd.Process.Kill()
	<-p.exited
}
