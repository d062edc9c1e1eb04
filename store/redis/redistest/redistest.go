// Package redistest starts real redis-server processes for tests: a
// standalone server, or a Redis Cluster of three or more masters, optionally
// with replicas. Every server listens on 127.0.0.1 on a free port below the
// system's ephemeral range (never 6379), keeps its files in t.TempDir(),
// persists nothing, and is stopped by t.Cleanup.
//
// The package needs redis-server and redis-cli on PATH. When they are
// missing the test fails with a message naming the package to install
// (`make deps` installs it where it can).
//
// DEBUG is enabled for local connections, so tests can make a server slow
// (DEBUG SLEEP). Servers expose their address and process, so that fault tests can kill a
// server (Kill) and bring it back on the same port (Restart).
//
// StartTLS, and ClusterOptions.TLS, start servers that also listen for TLS
// with certificates of a CA made for the test (NewPKI); those tests are
// skipped when redis-server was built without TLS.
package redistest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testbin"
)

// startTimeout bounds how long a server or a cluster may take to answer.
const startTimeout = 30 * time.Second

// Server is one redis-server process started by Start or StartCluster. Its
// methods are safe for concurrent use.
type Server struct {
	// Addr is the server's address, "127.0.0.1:port".
	Addr string
	// Port is the server's port.
	Port int
	// TLSAddr is the address of the TLS port of a server started by
	// StartTLS, "127.0.0.1:port"; empty otherwise.
	TLSAddr string
	// Dir is the server's working directory (inside t.TempDir()).
	Dir string

	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd     // guarded by mu; nil while stopped
	done chan struct{} // guarded by mu; closed when cmd has exited
}

// Cluster is a Redis Cluster started by StartCluster.
type Cluster struct {
	// Masters are the servers that hold the slots, in the order of their
	// slot ranges.
	Masters []*Server
	// Replicas are the replicas, in no particular order; each replicates
	// one master.
	Replicas []*Server
}

// ClusterOptions shapes a cluster. The zero value is three masters without
// replicas.
type ClusterOptions struct {
	// Masters is the number of masters; zero means 3. At least 3.
	Masters int
	// Replicas is the number of replicas per master; zero means none.
	Replicas int
	// NodeTimeout is cluster-node-timeout, after which a silent master is
	// failed over; zero means 2 seconds.
	NodeTimeout time.Duration
	// TLS, when set, gives every node a TLS port (Server.TLSAddr) as
	// StartTLS does, and makes the nodes speak TLS to each other
	// (tls-cluster, tls-replication), so that a client connected over TLS
	// is shown the nodes' TLS ports. The test is skipped when
	// redis-server has no TLS support.
	TLS *TLSOptions
}

// lookPath returns the path of a Redis binary, or fails t with a message
// naming the package to install.
func lookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("redistest: %s not found on PATH: the tests start real Redis servers; install the redis-server package (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) or run `make deps`", name)
	}
	return p
}

// Start starts a standalone redis-server without persistence and returns it
// once it answers PING. It is stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil, false)
}

// start starts one server with extra arguments, and with a TLS port when
// withTLS is set (extra then holds the TLS settings).
func start(t testing.TB, extra []string, withTLS bool) *Server {
	t.Helper()
	bin := lookPath(t, "redis-server")
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, Dir: dir}
		s.args = append([]string{
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--dir", dir,
			"--save", "",
			"--appendonly", "no",
			"--protected-mode", "no",
			"--daemonize", "no",
			"--logfile", filepath.Join(dir, "redis.log"),
			"--enable-debug-command", "local",
		}, extra...)
		if withTLS {
			tlsPort, err := freePort()
			if err != nil {
				lastErr = err
				continue
			}
			s.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
			s.args = append(s.args, "--tls-port", strconv.Itoa(tlsPort))
		}
		if err := s.launch(bin); err != nil {
			lastErr = err
			continue
		}
		if err := s.waitPing(startTimeout); err != nil {
			s.Stop()
			lastErr = err
			continue // most likely the port was taken meanwhile
		}
		t.Cleanup(s.Stop)
		return s
	}
	t.Fatalf("redistest: cannot start redis-server: %v (log: %s)", lastErr, tail(filepath.Join(dir, "redis.log")))
	return nil
}

// freePort returns a port p such that p and p+10000 (the cluster bus) are
// both free now. Both lie below the system's ephemeral port range where it
// leaves room (and above the standard ports of Redis, PostgreSQL and NATS):
// a client that keeps dialing a killed server's port from an ephemeral port
// could otherwise connect to itself on that very port (TCP simultaneous
// open), or hold it as its own end of a connection, and the server could
// not come back.
func freePort() (int, error) {
	lo, n := 10000, ephemeralLow()-10000-10000
	if n < 1000 { // no room below the range: take any
		lo, n = 20000, 30000
	}
	for i := 0; i < 100; i++ {
		p := lo + rand.IntN(n)
		l1, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		l1.Close()
		if err != nil {
			continue
		}
		l2.Close()
		return p, nil
	}
	return 0, errors.New("no free port pair found")
}

// ephemeralLow returns the first port of the system's ephemeral range: from
// Linux's ip_local_port_range, or IANA's 49152 elsewhere.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 49152
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 49152
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 49152
	}
	return lo
}

// launch starts the process; the server's lock need not be held.
func (s *Server) launch(bin string) error {
	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.Dir
	testbin.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }() // ends when the process exits
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// Process returns the running process, or nil when the server is stopped.
func (s *Server) Process() *os.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.cmd.Process
}

// Kill kills the process with SIGKILL and waits for it to exit. The server
// keeps its port and directory, so Restart can bring it back.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Stop stops the server; it is Kill, safe to call twice. The test's cleanup
// calls it.
func (s *Server) Stop() { s.Kill() }

// Restart starts a stopped server again on the same port and directory (a
// cluster node keeps its identity from nodes.conf) and waits until it
// answers PING.
func (s *Server) Restart() error {
	if s.Process() != nil {
		return errors.New("redistest: restart: server is running")
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redistest: restart: %w", err)
	}
	// The port was free while the server ran; once it is down, another
	// process picking a free port (a parallel test) may hold it for a
	// moment, and the new server exits at once. Try again a few times.
	for try := 1; ; try++ {
		if err := s.launch(bin); err != nil {
			return err
		}
		err := s.waitPing(startTimeout)
		if err == nil {
			return nil
		}
		s.Kill() // stopped again, as Restart found it
		if try == restartTries {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restartTries bounds the attempts of Restart.
const restartTries = 20

// waitPing waits until the server answers PING.
func (s *Server) waitPing(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		done := s.done
		s.mu.Unlock()
		if done == nil {
			return errors.New("server stopped")
		}
		select {
		case <-done:
			return errors.New("redis-server exited")
		default:
		}
		out, err := s.Do("PING")
		if err == nil && out == "PONG" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer PING within %s: %v", s.Addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Do sends one command to the server on a new connection and returns its
// reply as text: a simple or bulk string as is, an integer in decimal, an
// array as its elements one per line. A Redis error reply is returned as an
// error. It is meant for test set-up and inspection (INFO, CONFIG
// RESETSTAT, DEBUG), not for speed. Each call is a connection of its own,
// so a command that concerns its connection's earlier writes (WAIT) or
// state (MULTI, SELECT) has nothing to act on.
func (s *Server) Do(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		parts := make([]string, n)
		for i := range parts {
			if parts[i], err = readReply(r); err != nil {
				return "", err
			}
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// Info returns the fields of INFO section as a map, such as
// Info("commandstats")["cmdstat_evalsha"].
func (s *Server) Info(section string) (map[string]string, error) {
	out, err := s.Do("INFO", section)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			m[k] = v
		}
	}
	return m, nil
}

// ScriptStats returns the Redis time, in microseconds, and the number of
// the script calls (EVAL, EVALSHA and FCALL) the server has run, from INFO
// commandstats; it fails t when the server does not answer.
func (s *Server) ScriptStats(t testing.TB) (usec, calls int64) {
	t.Helper()
	info, err := s.Info("commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range info {
		if !strings.HasPrefix(name, "cmdstat_eval") && !strings.HasPrefix(name, "cmdstat_fcall") {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			k, n, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseInt(n, 10, 64)
			switch k {
			case "usec":
				usec += x
			case "calls":
				calls += x
			}
		}
	}
	return usec, calls
}

// StartCluster starts a Redis Cluster shaped by opts, with the slots spread
// evenly over the masters, and returns it once every node reports
// cluster_state:ok and agrees on the slots. It is stopped when the test
// ends.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.Masters < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, got %d", opts.Masters)
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = 2 * time.Second
	}
	cli := lookPath(t, "redis-cli")
	extra := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
		"--cluster-require-full-coverage", "yes",
	}
	var cliTLS []string
	if opts.TLS != nil {
		skipWithoutTLS(t)
		extra = append(append(extra, opts.TLS.args(t)...), "--tls-cluster", "yes", "--tls-replication", "yes")
		p := opts.TLS.PKI
		cliTLS = []string{"--tls", "--cacert", p.CAFile, "--cert", p.ClientCertFile, "--key", p.ClientKeyFile}
	}
	n := opts.Masters * (1 + opts.Replicas)
	servers := make([]*Server, n)
	for i := range servers {
		servers[i] = start(t, extra, opts.TLS != nil)
	}
	// Nodes that speak TLS to each other meet at their TLS ports.
	args := append(cliTLS, "--cluster", "create")
	for _, s := range servers {
		args = append(args, cmp.Or(s.TLSAddr, s.Addr))
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(opts.Replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c := &Cluster{}
	if err := c.wait(servers, opts.Masters*(1+opts.Replicas)); err != nil {
		t.Fatalf("redistest: cluster: %v", err)
	}
	for _, s := range servers {
		role, err := s.Info("replication")
		if err != nil {
			t.Fatalf("redistest: cluster: %v", err)
		}
		if role["role"] == "master" {
			c.Masters = append(c.Masters, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	if len(c.Masters) != opts.Masters {
		t.Fatalf("redistest: cluster: %d masters, want %d", len(c.Masters), opts.Masters)
	}
	return c
}

// wait waits until every server reports cluster_state:ok and knows all
// nodes.
func (c *Cluster) wait(servers []*Server, nodes int) error {
	deadline := time.Now().Add(startTimeout)
	for _, s := range servers {
		for {
			info, err := s.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(nodes)+"\r") &&
				strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not ready within %s: %v\n%s", s.Addr, startTimeout, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// WaitOK waits until every running node of the cluster reports
// cluster_state:ok, or the timeout passes. Fault tests use it after a
// failover or a restart.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, s := range c.Servers() {
		if s.Process() == nil {
			continue
		}
		for {
			info, err := s.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: %s not ok within %s: %v", s.Addr, timeout, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// ReplicasOf returns the replicas that currently replicate master m (by
// INFO replication), for failover tests.
func (c *Cluster) ReplicasOf(m *Server) []*Server {
	var rs []*Server
	for _, r := range c.Servers() {
		if r == m || r.Process() == nil {
			continue
		}
		info, err := r.Info("replication")
		if err == nil && info["role"] == "slave" && info["master_port"] == strconv.Itoa(m.Port) {
			rs = append(rs, r)
		}
	}
	return rs
}

// TLSAddrs returns the TLS addresses of the masters of a cluster started
// with ClusterOptions.TLS, the seed list for a client over TLS.
func (c *Cluster) TLSAddrs() []string {
	a := make([]string, len(c.Masters))
	for i, s := range c.Masters {
		a[i] = s.TLSAddr
	}
	return a
}

// Servers returns every node: the masters, then the replicas.
func (c *Cluster) Servers() []*Server {
	return append(append([]*Server(nil), c.Masters...), c.Replicas...)
}

// Addrs returns the addresses of the masters, the seed list for a client.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Masters))
	for i, s := range c.Masters {
		a[i] = s.Addr
	}
	return a
}

// tail returns the end of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
