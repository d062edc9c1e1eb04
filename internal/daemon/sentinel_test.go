package daemon_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestSentinelFailoverOverHTTP serves checks on a master found by Redis
// Sentinel and kills the master with SIGKILL: until the Sentinel has
// promoted the replica, every check is decided by Redis or by its rule's
// failure mode (fail_open admits, fail_closed answers 503), and after it,
// checks are decided by the new master, exactly.
func TestSentinelFailoverOverHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and a Sentinel, and waits for a failover")
	}
	sn := redistest.StartSentinel(t, redistest.SentinelOptions{})
	td := start(t, failurePolicy, func(c *daemon.Config) {
		c.StoreURL = sn.URL()
		c.Guard = guard.Config{Deadline: 300 * time.Millisecond}
	})
	source := func(client, resource string) (int, string) {
		r := td.check(t, `{"client_id":"`+client+`","resource":"`+resource+`"}`)
		return r.status, r.header.Get("X-RateLimit-Decision-Source")
	}
	if st, src := source("before", "/closed"); st != 200 || src != "store" {
		t.Fatalf("before the failover: %d from %s, want 200 from store", st, src)
	}

	sn.Primary.Kill()
	killed := time.Now()
	failOpen, failClosed := 0, 0
	for i := 0; ; i++ {
		client := fmt.Sprintf("during%d", i)
		switch st, src := source(client, "/open"); {
		case st == 200 && src == "fail_open":
			failOpen++
		case st != 200 || src != "store":
			t.Errorf("/open during the failover: %d from %s, want 200 from store or fail_open", st, src)
		}
		st, src := source(client, "/closed")
		switch {
		case st == 503 && src == "fail_closed":
			failClosed++
		case st != 200 || src != "store":
			t.Errorf("/closed during the failover: %d from %s, want 200 from store or 503 from fail_closed", st, src)
		}
		if st == 200 {
			if m, _ := sn.Master(); m == sn.Replica.Addr {
				break
			}
		}
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("no check decided by the new master within 20 s (%d fail_open, %d fail_closed)", failOpen, failClosed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("checks decided by Redis again %s after the kill; meanwhile %d fail_open, %d fail_closed", time.Since(killed).Round(time.Millisecond), failOpen, failClosed)
	if failOpen == 0 || failClosed == 0 {
		t.Errorf("while the master was down: %d fail_open, %d fail_closed; want some of each", failOpen, failClosed)
	}
	// Exact on the new master: a limit of 4 admits 4, each decided by it.
	admitted := 0
	for i := range 8 {
		st, src := source("after", "/local")
		if st == 200 {
			admitted++
		}
		if src != "store" && src != "over_limit_cache" {
			t.Errorf("check %d after the failover: %d from %s, want store", i, st, src)
		}
	}
	if admitted != 4 {
		t.Errorf("a limit of 4 after the failover admitted %d", admitted)
	}
	if k, err := sn.Replica.Do("KEYS", "*after*"); err != nil || k == "" {
		t.Errorf("the new master holds no key of the checks: %q, %v", k, err)
	}
}
