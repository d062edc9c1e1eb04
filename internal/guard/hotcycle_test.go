package guard

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
)

// TestHotKeyLeaseCycle runs the hot-key tier's whole cycle in a
// testing/synctest bubble, where its sync loop's ticker and the checks
// share one fake clock: a key checked at 5,000 a second (threshold 500)
// becomes hot within a detection window and is then decided from leases
// topped up every sync interval, with a store request per sync rather
// than per check; checked at 50 a second, it cools down within two
// windows and its checks go to the store again.
func TestHotKeyLeaseCycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		inner := &guardtest.Faulty{Inner: newMemory(t, nil)}
		g := newGuard(t, inner, hotConfig()) // threshold 500/s, sync every 10 ms, windows of 100 ms
		p := params(t, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 100_000_000, Window: time.Minute})
		ctx := context.Background()
		sources := map[engine.Source]int{}
		check := func() {
			d, src, err := check1(ctx, g, "hot", p, 1)
			if err != nil || !d.Allowed {
				t.Fatalf("check far below the limit: %+v, %v", d, err)
			}
			sources[src]++
		}
		// Hot: 5 checks a millisecond for a second.
		for range 1000 {
			for range 5 {
				check()
			}
			time.Sleep(time.Millisecond)
		}
		if n := g.Stats().HotKeys; n != 1 {
			t.Fatalf("after a second at 5,000 checks/s: %d hot keys, want 1", n)
		}
		reached := inner.Requests()
		// The first 50 checks go to the store (the promotion threshold of
		// a window: 500/s x 100 ms), then one top-up a sync, every 10 ms:
		// 150 requests. Checks and syncs falling due at one instant run in
		// either order, and a check that finds its lease empty goes to the
		// store (150 to 161 requests seen): hence the margins.
		if leased := sources[engine.SourceHotKey]; leased < 4900 || reached > 200 {
			t.Errorf("5,000 checks: %d from leases, %d requests reached the store; want at least 4,900 and at most 200", leased, reached)
		}
		if syncs := g.Stats().Syncs; syncs < 98 || syncs > 105 {
			t.Errorf("%d syncs in a second, want 100 (every 10 ms)", syncs)
		}
		// Cool: one check every 20 ms, under half the threshold.
		for range 15 {
			check()
			time.Sleep(20 * time.Millisecond)
		}
		if n := g.Stats().HotKeys; n != 0 {
			t.Errorf("after 300 ms at 50 checks/s: %d hot keys, want 0", n)
		}
		if _, src, _ := check1(ctx, g, "hot", p, 1); src != engine.SourceStore {
			t.Errorf("cooled key decided by %s, want the store", src)
		}
	})
}
