// Package pgtest starts a real PostgreSQL server for tests: initdb and
// postgres from PATH (or Debian's /usr/lib/postgresql), on a free port of
// 127.0.0.1 (never 5432), with its data in a temporary directory, trust
// authentication and fsync off, since a test's data need not survive the
// machine crashing; commits are still synchronous, so a killed server keeps
// them. Start one per test package in TestMain and give each test its own
// database (NewDatabase).
//
// PostgreSQL refuses to run as root; when the tests run as root the server
// runs as the system's postgres user, which the distribution's package
// creates. `make deps` installs the package where it can.
package pgtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sluicehq/sluice/internal/testbin"
)

// installHint says how to get the server's binaries.
const installHint = "the tests start a real PostgreSQL: install it (Debian/Ubuntu: apt-get install postgresql; " +
	"macOS: brew install postgresql) so that initdb and postgres are on PATH, or run `make deps`"

// startTimeout bounds how long the server may take to accept connections.
const startTimeout = 60 * time.Second

// Server is a PostgreSQL server started by Start. Its methods are safe for
// concurrent use.
type Server struct {
	// Port is the server's port on 127.0.0.1.
	Port int

	bin, dir string
	cred     *syscall.Credential // the user the server runs as, when not ours
	n        atomic.Int64        // databases made
	// id names this server's databases: a client of a killed server that
	// reconnects to its port, taken meanwhile by another test server,
	// finds no database of its name there rather than writing into it.
	id string

	mu   sync.Mutex
	cmd  *exec.Cmd     // guarded by mu; nil while stopped
	done chan struct{} // guarded by mu; closed when cmd has exited
}

// Start initialises a cluster in a temporary directory and starts postgres
// on a free port. Call Close when done (at the end of TestMain).
func Start() (*Server, error) {
	initdb, err := lookPath("initdb")
	if err != nil {
		return nil, err
	}
	bin, err := lookPath("postgres")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, id: strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.Itoa(os.Getpid())}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root, and PostgreSQL refuses to run as root: no postgres user to run it as (%v)", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	cmd := exec.Command(initdb, "-D", data, "-U", "sluice", "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %v: %s", err, out)
	}
	var lastErr error
	for range 10 {
		s.Port, lastErr = freePort()
		if lastErr != nil {
			continue
		}
		if lastErr = s.Restart(); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// Restart starts the server again after Stop or Kill, on the same port and
// data directory.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	// After Kill, the old server's backends may hold its shared memory for
	// a moment more, and the new postmaster refuses to start until they
	// have gone.
	var err error
	for range 50 {
		if err = s.launchLocked(); err == nil || !strings.Contains(err.Error(), "pre-existing shared memory block") {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// launchLocked starts postgres and waits until it accepts connections.
// Requires mu held.
func (s *Server) launchLocked() error {
	cmd := exec.Command(s.bin, "-D", filepath.Join(s.dir, "data"),
		"-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+s.dir,
		// fsync off loses data only when the machine crashes; commits
		// stay synchronous so that a killed server (Kill) keeps them.
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=50")
	// Its own process group, so that Kill takes the backends too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	testbin.DieWithParent(cmd)
	log, err := os.Create(filepath.Join(s.dir, "postgres.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		cancel()
		if err == nil {
			c.Close(context.Background())
			s.cmd, s.done = cmd, done
			return nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
			return fmt.Errorf("pgtest: postgres exited at start: %s", b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("pgtest: postgres not accepting connections after %s: %v", startTimeout, err)
		}
	}
}

// URL returns the connection string of database db.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://sluice@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// NewDatabase creates an empty database for t and returns its connection
// string. The database lives as long as the server.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("test_%s_%d", s.id, s.n.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer c.Close(ctx)
	// name is made here of a counter, a clock and a process id, never of
	// input: safe to splice.
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return s.URL(name)
}

// Stop stops the server with a fast shutdown (SIGINT) and waits for it.
func (s *Server) Stop() { s.signal(syscall.SIGINT) }

// Kill kills the server and its backends (SIGKILL), as a crash would.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if sig == syscall.SIGKILL {
		// The backends too, as a crash of the machine would: each calls
		// setsid, so the postmaster's group does not hold them, and a
		// backend whose postmaster is gone goes on serving its
		// connection until it notices.
		for _, pid := range children(s.cmd.Process.Pid) {
			syscall.Kill(pid, sig)
		}
		syscall.Kill(-s.cmd.Process.Pid, sig)
	} else {
		s.cmd.Process.Signal(sig)
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd, s.done = nil, nil
}

// Close stops the server and removes its files.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// lookPath finds a PostgreSQL binary on PATH or, where Debian and Ubuntu
// put them off PATH, in the newest /usr/lib/postgresql/VERSION/bin.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if p := filepath.Join(d, name); isExec(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgtest: %s not found: %s", name, installHint)
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// freePort returns a port that was free a moment ago, below the ephemeral
// range so that outgoing connections do not take it meanwhile.
func freePort() (int, error) {
	for range 50 {
		p := 20000 + rand.IntN(10000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			l.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("pgtest: no free port")
}

// children returns the processes whose parent is pid, read from /proc
// (none where there is no /proc).
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses,
		// so the fields are counted from the last ')'.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}
