package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestSentinelFailover runs the store on a master found by Redis Sentinel,
// kills the master with SIGKILL and checks on: while the Sentinel fails
// over, every call either is decided or fails with an error wrapping
// sluice.ErrStoreUnavailable (which the engine's guard turns into the
// rule's failure mode); once the replica is promoted, calls go to it, the
// counts it had applied before the failure are still there, and a limit
// of N on a new key admits exactly N of concurrent calls.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and a Sentinel, and waits for a failover")
	}
	sn := redistest.StartSentinel(t, redistest.SentinelOptions{})
	cfg, err := ParseURL(sn.URL())
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, cfg)
	if s.Cluster() {
		t.Fatal("a Sentinel's master taken for a cluster")
	}
	const limit = 10
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: time.Hour})
	admitted := func(key string, n int) int {
		var got atomic.Int64
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if check(t, s, store.Request{Key: key, Params: p, Cost: 1}).Allowed {
					got.Add(1)
				}
			}()
		}
		wg.Wait()
		return int(got.Load())
	}
	if got := admitted("rl:sentinel:{before}", limit+5); got != limit {
		t.Fatalf("before the failover: %d of %d admitted, want %d", got, limit+5, limit)
	}
	// Counts the replica has not applied yet may be lost (replication is
	// asynchronous); wait until it has them all.
	spent := time.Now()
	if err := sn.WaitReplicated(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("the replica applied the counts %s after they were spent", time.Since(spent).Round(time.Millisecond))
	if n, err := sn.Replica.Do("EXISTS", "rl:sentinel:{before}"); err != nil || n != "1" {
		t.Fatalf("the replica holds no count of the spent key before the failover: %q, %v", n, err)
	}

	sn.Primary.Kill()
	killed := time.Now()
	failed, decided := 0, 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		out := make([]sluice.Decision, 1)
		err := s.Check(ctx, []store.Request{{Key: "rl:sentinel:{during}", Params: p, Cost: 0}}, out)
		cancel()
		switch {
		case err == nil:
			decided++
		case errors.Is(err, sluice.ErrStoreUnavailable):
			failed++
		default:
			t.Fatalf("Check during the failover: %v, want an error wrapping ErrStoreUnavailable", err)
		}
		if err == nil {
			if m, _ := sn.Master(); m == sn.Replica.Addr {
				break
			}
		}
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("no check decided on the new master within 20 s (%d failed, %d decided; last error %v)", failed, decided, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("failover: checks decided again %s after the kill; %d failed meanwhile", time.Since(killed).Round(time.Millisecond), failed)
	if failed == 0 {
		t.Error("no check failed while the master was down")
	}
	if info, err := sn.Replica.Info("replication"); err != nil || info["role"] != "master" {
		t.Fatalf("replica after the failover: role %q, %v", info["role"], err)
	}
	if d := check(t, s, store.Request{Key: "rl:sentinel:{before}", Params: p, Cost: 1}); d.Allowed {
		t.Error("after the failover: the replicated count was lost, a spent limit admits again")
	}
	for i := range 3 {
		key := fmt.Sprintf("rl:sentinel:{after%d}", i)
		if got := admitted(key, limit+5); got != limit {
			t.Errorf("after the failover, %s: %d of %d admitted, want %d", key, got, limit+5, limit)
		}
	}
	if n, err := sn.Replica.Do("EXISTS", "rl:sentinel:{after0}"); err != nil || n != "1" {
		t.Errorf("the new master holds no count of the new key: %q, %v", n, err)
	}
}

// TestSentinelUnknownMaster: a master the Sentinels do not know is an
// error naming it, promptly.
func TestSentinelUnknownMaster(t *testing.T) {
	sn := redistest.StartSentinel(t, redistest.SentinelOptions{})
	start := time.Now()
	_, err := New(Config{Addrs: sn.Addrs(), MasterSet: "typo"})
	if err == nil || !errors.Is(err, sluice.ErrStoreUnavailable) || !strings.Contains(err.Error(), `master "typo"`) {
		t.Errorf("New with an unknown master: %v, want an error naming it", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("New with an unknown master took %s", took)
	}
}
