// Package natstest starts a real NATS server with JetStream for tests: a
// process built once from the tools module internal/tools/nats into the
// user's cache directory, on a free port of 127.0.0.1, with JetStream's
// files in a temporary directory. Start one per test package in TestMain
// and give each test its own stream name; Stop (or Kill) and Start
// restart the server on the same port and files, as an upgrade (or a
// crash) and recovery would.
package natstest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/testbin"
)

// toolsModule is the directory, relative to the main module's root, of
// the module that pins the NATS server; its own module keeps the server
// and its dependencies out of Sluice's go.mod.
const toolsModule = "internal/tools/nats"

// installHint says how to get the server when the tests cannot build it.
const installHint = "the tests build a NATS server from " + toolsModule + " into the user's cache directory, " +
	"which needs the Go module proxy (or a module cache holding github.com/nats-io/nats-server/v2); " +
	"try `cd " + toolsModule + " && go build -o /dev/null .` to see why it fails"

// Server is a running (or stopped) NATS server.
type Server struct {
	bin, dir string
	port     int
	tls      *TLSOptions // nil: plain

	mu   sync.Mutex
	proc *testbin.Process // nil while stopped
	n    atomic.Int64
}

// Start builds the server if needed and starts it on a free port with a
// new storage directory.
func Start() (*Server, error) { return StartTLS(nil) }

// TLSOptions are the PEM files of a server that speaks TLS only.
type TLSOptions struct {
	// CertFile and KeyFile are the server's certificate and key.
	CertFile, KeyFile string
	// ClientCAFile, when set, makes the server require client
	// certificates that its CAs sign.
	ClientCAFile string
}

// StartTLS is Start for a server that speaks TLS with the files of o (nil
// means plain TCP, as Start); URL is then tls://.
func StartTLS(o *TLSOptions) (*Server, error) {
	bin, err := testbin.Build(toolsModule, ".", "nats-test")
	if err != nil {
		return nil, fmt.Errorf("natstest: no NATS server: %w\n%s", err, installHint)
	}
	dir, err := os.MkdirTemp("", "natstest-")
	if err != nil {
		return nil, err
	}
	var last error
	for range 3 { // a free port may be taken before the server listens
		port, err := freePort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s := &Server{bin: bin, dir: dir, port: port, tls: o}
		if last = s.Start(); last == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("natstest: start NATS: %w", last)
}

// URL is the client URL, such as nats://127.0.0.1:41234, or
// tls://127.0.0.1:41234 for a server started by StartTLS.
func (s *Server) URL() string {
	if s.tls != nil {
		return "tls://" + s.Addr()
	}
	return "nats://" + s.Addr()
}

// Addr is the client address, host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Name returns a name (for a stream, say) no other caller of this Server
// gets: prefix followed by a number.
func (s *Server) Name(prefix string) string { return prefix + strconv.FormatInt(s.n.Add(1), 10) }

// Start starts the stopped server on its port and storage directory: the
// streams and messages stored before Stop are still there. It does
// nothing when the server runs.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return nil
	}
	args := []string{"-port", strconv.Itoa(s.port), "-store-dir", filepath.Join(s.dir, "jetstream")}
	if o := s.tls; o != nil {
		args = append(args, "-tlscert", o.CertFile, "-tlskey", o.KeyFile)
		if o.ClientCAFile != "" {
			args = append(args, "-tlscacert", o.ClientCAFile)
		}
	}
	proc, err := testbin.Start("NATS", s.bin, args, 30*time.Second)
	if err != nil {
		return err
	}
	s.proc = proc
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL after 10s), keeping its
// files.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	s.proc.Stop()
	s.proc = nil
}

// Kill kills the server (SIGKILL), as a crash would, keeping its files.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	s.proc.Kill()
	s.proc = nil
}

// Close stops the server and removes its files.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// freePort returns a port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
