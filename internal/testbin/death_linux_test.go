package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDieWithParent: a parent process starts a child with DieWithParent and
// is killed; the child dies with it.
func TestDieWithParent(t *testing.T) {
	if os.Getenv("TESTBIN_PARENT") == "1" {
		child := exec.Command("sleep", "60")
		DieWithParent(child)
		if err := child.Start(); err != nil {
			os.Exit(2)
		}
		fmt.Println(child.Process.Pid)
		time.Sleep(time.Minute)
		return
	}
	parent := exec.Command(os.Args[0], "-test.run", "^TestDieWithParent$")
	parent.Env = append(os.Environ(), "TESTBIN_PARENT=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	n, _ := out.Read(buf)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		parent.Process.Kill()
		t.Fatalf("the parent printed %q", buf[:n])
	}
	parent.Process.Kill()
	parent.Wait()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); err != nil { // gone (reaped by init)
			return
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the child %d outlived its parent by 5s", pid)
		}
	}
}
