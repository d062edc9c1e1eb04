package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MasterName is the name under which the Sentinels of StartSentinel
// monitor the primary.
const MasterName = "sluice"

// Sentinel is a primary, its replica and the Sentinels that monitor them,
// started by StartSentinel.
type Sentinel struct {
	// Primary is the server that was the master at start, and Replica the
	// one that replicated it; after a failover their roles are swapped.
	Primary, Replica *Server
	// Sentinels are the redis-server processes run in Sentinel mode.
	Sentinels []*Server
}

// SentinelOptions shape a Sentinel set-up. The zero value is one Sentinel
// that fails over after one second of silence.
type SentinelOptions struct {
	// Sentinels is the number of Sentinels; zero means 1. A majority of
	// them must agree to fail over.
	Sentinels int
	// DownAfter is down-after-milliseconds: how long the primary may stay
	// silent before it is taken for down. Zero means one second.
	DownAfter time.Duration
}

// StartSentinel starts a primary, a replica of it and the Sentinels opts
// asks for, every one on a free port, and returns them once the replica
// applies the primary's writes as they come and every Sentinel knows the
// replica. A single Sentinel is enough to declare the primary down (quorum
// 1); failover-timeout is short (two seconds), so that a failover that
// stalls is tried again soon. They are stopped when the test ends; when
// it failed, the ends of their logs are logged first.
func StartSentinel(t testing.TB, opts SentinelOptions) *Sentinel {
	t.Helper()
	if opts.Sentinels == 0 {
		opts.Sentinels = 1
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = time.Second
	}
	// The replica's first sync starts at once, not after the 5 seconds
	// a primary waits by default for more replicas to share it.
	primary := start(t, []string{"--repl-diskless-sync-delay", "0"}, false)
	replica := start(t, []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port)}, false)
	if err := waitFor(startTimeout, func() error {
		info, err := replica.Info("replication")
		if err == nil && info["master_link_status"] != "up" {
			err = fmt.Errorf("replica link %q", info["master_link_status"])
		}
		return err
	}); err != nil {
		t.Fatalf("redistest: replica of %s: %v", primary.Addr, err)
	}
	s := &Sentinel{Primary: primary, Replica: replica}
	// After the first sync the primary holds its writes until the
	// replica's next acknowledgement, which may come a second later: send
	// one (a PUBLISH is replicated and leaves no key) and wait until the
	// replica applies it.
	if _, err := primary.Do("PUBLISH", "redistest", "sync"); err != nil {
		t.Fatalf("redistest: primary %s: %v", primary.Addr, err)
	}
	if err := s.WaitReplicated(startTimeout); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for range opts.Sentinels {
		s.Sentinels = append(s.Sentinels, startSentinel(t, primary.Port, opts.DownAfter))
	}
	for _, sn := range s.Sentinels {
		if err := waitFor(startTimeout, func() error {
			out, err := sn.Do("SENTINEL", "REPLICAS", MasterName)
			if err == nil && !strings.Contains(out, strconv.Itoa(replica.Port)) {
				err = fmt.Errorf("replica not known yet")
			}
			return err
		}); err != nil {
			t.Fatalf("redistest: sentinel %s: %v (log: %s)", sn.Addr, err, tail(filepath.Join(sn.Dir, "redis.log")))
		}
	}
	// Runs before the servers stop and their directories go.
	t.Cleanup(func() {
		if t.Failed() {
			s.logTails(t)
		}
	})
	return s
}

// WaitReplicated waits until the replica has applied every write the
// primary had made when it was called: until the replica, following the
// primary's replication stream, reports an offset at least the primary's.
// A test calls it before killing the primary to know which writes the
// failover must keep.
//
// The command WAIT cannot tell this here: it waits only for the writes
// made on its own connection, and Server.Do opens a new one, so WAIT
// there returns at once with every connected replica counted.
func (s *Sentinel) WaitReplicated(timeout time.Duration) error {
	p, err := s.Primary.Info("replication")
	if err != nil {
		return fmt.Errorf("redistest: primary %s: %w", s.Primary.Addr, err)
	}
	want, err := strconv.ParseInt(p["master_repl_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("redistest: primary %s: master_repl_offset %q", s.Primary.Addr, p["master_repl_offset"])
	}
	return waitFor(timeout, func() error {
		r, err := s.Replica.Info("replication")
		if err != nil {
			return fmt.Errorf("redistest: replica %s: %w", s.Replica.Addr, err)
		}
		got, _ := strconv.ParseInt(r["slave_repl_offset"], 10, 64)
		if r["role"] != "slave" || r["master_replid"] != p["master_replid"] || got < want {
			return fmt.Errorf("redistest: replica %s: role %s, replication %s at offset %d; primary %s at %d",
				s.Replica.Addr, r["role"], r["master_replid"], got, p["master_replid"], want)
		}
		return nil
	})
}

// logTails logs the end of the log of every server of the set-up, for a
// test that failed.
func (s *Sentinel) logTails(t testing.TB) {
	t.Helper()
	logTail := func(name string, srv *Server) {
		t.Logf("redistest: log of the %s %s:\n%s", name, srv.Addr, tail(filepath.Join(srv.Dir, "redis.log")))
	}
	logTail("primary", s.Primary)
	logTail("replica", s.Replica)
	for _, sn := range s.Sentinels {
		logTail("sentinel", sn)
	}
}

// startSentinel starts one Sentinel monitoring the primary on port.
func startSentinel(t testing.TB, port int, downAfter time.Duration) *Server {
	t.Helper()
	bin := lookPath(t, "redis-server")
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		p, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		// A Sentinel rewrites its configuration file, so it gets one of
		// its own.
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir %s\nlogfile %s\n", p, dir, filepath.Join(dir, "redis.log")) +
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n", MasterName, port) +
			fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", MasterName, downAfter.Milliseconds()) +
			fmt.Sprintf("sentinel failover-timeout %s 2000\n", MasterName) +
			fmt.Sprintf("sentinel parallel-syncs %s 1\n", MasterName)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), Port: p, Dir: dir, args: []string{conf, "--sentinel"}}
		if err := s.launch(bin); err != nil {
			lastErr = err
			continue
		}
		if err := s.waitPing(startTimeout); err != nil {
			s.Stop()
			lastErr = err
			continue
		}
		t.Cleanup(s.Stop)
		return s
	}
	t.Fatalf("redistest: cannot start a sentinel: %v (log: %s)", lastErr, tail(filepath.Join(dir, "redis.log")))
	return nil
}

// Addrs returns the addresses of the Sentinels.
func (s *Sentinel) Addrs() []string {
	a := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		a[i] = sn.Addr
	}
	return a
}

// URL returns the store URL of the set-up:
// redis-sentinel://host:port,.../sluice.
func (s *Sentinel) URL() string {
	return "redis-sentinel://" + strings.Join(s.Addrs(), ",") + "/" + MasterName
}

// Master returns the address of the master as the first Sentinel reports
// it (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinel) Master() (string, error) {
	out, err := s.Sentinels[0].Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
	if err != nil {
		return "", err
	}
	host, port, ok := strings.Cut(out, "\n")
	if !ok {
		return "", fmt.Errorf("redistest: unexpected reply %q", out)
	}
	return net.JoinHostPort(host, port), nil
}

// waitFor calls f until it returns nil or the timeout passes, and returns
// its last error then.
func waitFor(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
