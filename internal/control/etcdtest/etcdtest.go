// Package etcdtest starts a real etcd server for tests: a process built
// once from the tools module internal/tools/etcd into the user's cache
// directory, on free ports of 127.0.0.1, with its data in a temporary
// directory. Start one per test package in TestMain and give each test its
// own key prefix. StartConfig starts one over TLS, with a throwaway CA, or
// with etcd's authentication on.
package etcdtest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/testbin"
)

// toolsModule is the directory, relative to the main module's root, of
// the module that pins the etcd server; its own module keeps the server
// and its dependencies out of Sluice's go.mod.
const toolsModule = "internal/tools/etcd"

// installHint says how to get the server when the tests cannot build it.
const installHint = "the tests build etcd from " + toolsModule + " into the user's cache directory, " +
	"which needs the Go module proxy (or a module cache holding go.etcd.io/etcd/server/v3); " +
	"try `cd " + toolsModule + " && go build -o /dev/null .` to see why it fails"

// binary returns the path of the test etcd server, built once and kept
// in the user's cache.
func binary() (string, error) { return testbin.Build(toolsModule, ".", "etcd-test") }

// Config chooses how a server is started. The zero value serves plain
// HTTP without authentication.
type Config struct {
	// TLS serves clients over TLS, with a certificate for 127.0.0.1 and
	// localhost signed by a CA made for this server (Server.CAFile).
	TLS bool
	// ClientCerts, with TLS, requires clients to present a certificate
	// signed by that CA (Server.ClientCertFile and ClientKeyFile).
	ClientCerts bool
	// RootPassword, when set, turns etcd's authentication on, with the
	// user root of this password.
	RootPassword string
}

// Server is a running (or stopped) etcd server.
type Server struct {
	bin, dir     string
	client, peer string
	cfg          Config

	mu   sync.Mutex
	proc *testbin.Process // nil while stopped
	n    atomic.Int64
}

// Start builds the server if needed and starts it on free ports with a
// new data directory.
func Start() (*Server, error) { return StartConfig(Config{}) }

// StartConfig is Start with the TLS and authentication of cfg.
func StartConfig(cfg Config) (*Server, error) {
	bin, err := binary()
	if err != nil {
		return nil, fmt.Errorf("etcdtest: no etcd server: %w\n%s", err, installHint)
	}
	dir, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return nil, err
	}
	scheme := "http://"
	if cfg.TLS {
		scheme = "https://"
		if err := writeCerts(dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	var last error
	for range 3 { // a free port may be taken before the server listens
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		s := &Server{bin: bin, dir: dir, cfg: cfg, client: scheme + "127.0.0.1:" + strconv.Itoa(ports[0]), peer: "http://127.0.0.1:" + strconv.Itoa(ports[1])}
		if last = s.Start(); last == nil {
			if cfg.RootPassword == "" {
				return s, nil
			}
			if last = s.enableAuth(); last == nil {
				return s, nil
			}
			s.Stop()
			break
		}
		os.RemoveAll(filepath.Join(dir, "data"))
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("etcdtest: start etcd: %w", last)
}

// URL is the client URL, such as http://127.0.0.1:41234 (https with TLS).
func (s *Server) URL() string { return s.client }

// Endpoint is the client address, host:port.
func (s *Server) Endpoint() string {
	return strings.TrimPrefix(strings.TrimPrefix(s.client, "http://"), "https://")
}

// CAFile is the PEM file of the CA of a TLS server's certificate (and of
// the client certificate); empty without TLS.
func (s *Server) CAFile() string { return s.file(caFile) }

// ClientCertFile and ClientKeyFile are the PEM files of a client
// certificate the CA signed, and of its key; empty without TLS.
func (s *Server) ClientCertFile() string { return s.file(clientCertFile) }

// ClientKeyFile: see ClientCertFile.
func (s *Server) ClientKeyFile() string { return s.file(clientKeyFile) }

func (s *Server) file(name string) string {
	if !s.cfg.TLS {
		return ""
	}
	return filepath.Join(s.dir, name)
}

// Prefix returns a key prefix no other caller of this Server gets.
func (s *Server) Prefix() string { return "/test" + strconv.FormatInt(s.n.Add(1), 10) + "/" }

// Start starts the stopped server on its ports and data directory: the
// data written before Stop is still there.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return nil
	}
	args := []string{"-client", s.client, "-peer", s.peer, "-data-dir", filepath.Join(s.dir, "data")}
	if s.cfg.TLS {
		args = append(args, "-cert-file", filepath.Join(s.dir, serverCertFile), "-key-file", filepath.Join(s.dir, serverKeyFile))
		if s.cfg.ClientCerts {
			args = append(args, "-trusted-ca-file", filepath.Join(s.dir, caFile))
		}
	}
	proc, err := testbin.Start("etcd", s.bin, args, 60*time.Second)
	if err != nil {
		return err
	}
	s.proc = proc
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL after 10s), keeping its
// data.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	s.proc.Stop()
	s.proc = nil
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// freePorts returns n ports of 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
