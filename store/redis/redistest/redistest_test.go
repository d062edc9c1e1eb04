package redistest

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStart(t *testing.T) {
	s := Start(t)
	if s.Port == 6379 {
		t.Fatalf("port 6379 used")
	}
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	got, err := s.Do("GET", "k")
	if err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v; want v", got, err)
	}
	s.Kill()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
}

func TestStartCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := StartCluster(t, ClusterOptions{Replicas: 1})
	if len(c.Masters) != 3 || len(c.Replicas) != 3 {
		t.Fatalf("got %d masters, %d replicas; want 3, 3", len(c.Masters), len(c.Replicas))
	}
	for _, m := range c.Masters {
		if rs := c.ReplicasOf(m); len(rs) != 1 {
			t.Errorf("master %s has %d replicas, want 1", m.Addr, len(rs))
		}
	}
	info, err := c.Masters[0].Do("CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("CLUSTER INFO: %v\n%s", err, info)
	}
}

// TestFreePortBelowEphemeralRange checks that a server's port and its
// cluster bus port lie below the ephemeral range, where a client dialing a
// killed server cannot take the port as its own end.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low-20000 < 1000 {
		t.Skipf("ephemeral range starts at %d: no room below it", low)
	}
	for range 50 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < 10000 || p+10000 >= low {
			t.Fatalf("port %d (bus %d) is not in [10000, %d)", p, p+10000, low)
		}
	}
}

func TestStartSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	s := StartSentinel(t, SentinelOptions{Sentinels: 3})
	if len(s.Sentinels) != 3 || len(s.Addrs()) != 3 {
		t.Fatalf("%d sentinels, want 3", len(s.Sentinels))
	}
	for _, sn := range s.Sentinels {
		out, err := sn.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
		if err != nil || strings.ReplaceAll(out, "\n", ":") != s.Primary.Addr {
			t.Errorf("sentinel %s: master %q, %v; want %s", sn.Addr, out, err, s.Primary.Addr)
		}
	}
	if m, err := s.Master(); err != nil || m != s.Primary.Addr {
		t.Errorf("Master() = %q, %v; want %s", m, err, s.Primary.Addr)
	}
	if info, err := s.Replica.Info("replication"); err != nil || info["role"] != "slave" {
		t.Errorf("replica: role %q, %v", info["role"], err)
	}
	if u := s.URL(); !strings.HasPrefix(u, "redis-sentinel://127.0.0.1:") || !strings.HasSuffix(u, "/"+MasterName) || strings.Count(u, ",") != 2 {
		t.Errorf("URL() = %q", u)
	}
}

// TestSentinelWaitReplicated: WaitReplicated returns only once the replica
// has applied the primary's writes.
func TestSentinelWaitReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	s := StartSentinel(t, SentinelOptions{})
	// A stopped replica keeps its connection, but applies nothing.
	if err := s.Replica.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			s.Replica.Process().Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	if _, err := s.Primary.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	n, err := s.Primary.Do("WAIT", "1", "100")
	t.Logf("WAIT 1 on a connection of its own, with the replica stopped: %q, %v", n, err)
	done := make(chan error, 1)
	go func() { done <- s.WaitReplicated(10 * time.Second) }()
	select {
	case err := <-done:
		t.Fatalf("WaitReplicated returned while the replica was stopped: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, err := s.Replica.Do("GET", "k"); err != nil || v != "v" {
		t.Errorf("replica after WaitReplicated: GET k = %q, %v; want v", v, err)
	}
}
