// Package etcdtest runs a real etcd server for tests: one member, embedded
// with go.etcd.io/etcd/server/v3/embed in a small program built from the
// module internal/tools/etcd (so that etcd's server stays out of Sluice's
// go.mod), started as a process on free ports. A package's tests share one
// server (start it in TestMain), and may stop and start it again on the
// same data to test what happens while etcd is down.
package etcdtest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// toolsModule is the directory, relative to the root of the main module,
// of the module that builds the server.
const toolsModule = "internal/tools/etcd"

// installHint says how to get the server when the tests cannot build it.
const installHint = "the tests build it from " + toolsModule + " with the Go module proxy; " +
	"check that `cd " + toolsModule + " && go build .` works"

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
)

// Binary returns the path of the server's executable, built once per test
// process into the user's cache directory, keyed by the tools module's
// files, for the next test processes.
func Binary() (string, error) {
	binaryOnce.Do(func() { binaryPath, binaryErr = build() })
	return binaryPath, binaryErr
}

func build() (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("etcdtest: find the main module with `go env GOMOD`: %w", err)
	}
	dir := filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), filepath.FromSlash(toolsModule))
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", fmt.Errorf("etcdtest: read the tools module: %w", err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	cache = filepath.Join(cache, "sluice")
	bin := filepath.Join(cache, "etcd-"+hex.EncodeToString(h.Sum(nil))[:16]+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	tmp, err := os.CreateTemp(cache, "etcd-*.tmp")
	if err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-o", tmp.Name(), ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("etcdtest: go build in %s: %w (%s)\n%s", toolsModule, err, installHint, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	return bin, nil
}

// Server is one etcd member running as a process.
type Server struct {
	dir        string
	clientURL  string
	peerURL    string
	bin        string
	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	ownDataDir bool
}

// Start builds the server if needed and starts it on free loopback ports,
// keeping its data in a new temporary directory; Close removes it.
func Start() (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-etcd-")
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	ports, err := freePorts(2)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{
		dir:        filepath.Join(dir, "data"),
		clientURL:  fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		peerURL:    fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		bin:        bin,
		ownDataDir: true,
	}
	if err := s.Restart(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Endpoint returns the client URL, such as http://127.0.0.1:40123.
func (s *Server) Endpoint() string { return s.clientURL }

// URL returns the server as Sluice's --config-store takes it.
func (s *Server) URL() string { return "etcd://" + strings.TrimPrefix(s.clientURL, "http://") }

// Restart starts the server again on the same ports and data after Stop.
// It returns once the server serves clients.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(s.bin, "-data-dir", s.dir, "-client-url", s.clientURL, "-peer-url", s.peerURL)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("etcdtest: %w", err)
	}
	if os.Getenv("SLUICE_ETCD_LOG") != "" {
		cmd.Stderr = os.Stderr // etcd logs errors only, and some at every stop
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", s.bin, err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if !ok && strings.TrimSpace(sc.Text()) == "ready" {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	select {
	case ok := <-ready:
		if !ok {
			<-exited
			return fmt.Errorf("etcdtest: the server exited before it was ready")
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-exited
		return fmt.Errorf("etcdtest: the server was not ready in 60s")
	}
	s.cmd, s.exited = cmd, exited
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL after 10s), keeping its
// data for Restart.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.Stop()
	if s.ownDataDir {
		os.RemoveAll(filepath.Dir(s.dir))
	}
}

// freePorts returns n distinct free TCP ports on loopback.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
