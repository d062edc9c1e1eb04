package guard

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// TestHotTierDetectionAlone drives the hot-key tier's detection without a
// guard or a store, in a testing/synctest bubble (promotion and cooling
// read the clock): a key becomes hot at Threshold x Window checks in a
// window, up to MaxKeys; it stays while checked at least half as often a
// window, and leaves below that; keys of a limit whose window spans fewer
// than 40 sync intervals never become hot.
func TestHotTierDetectionAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window = 100 * time.Millisecond
		tier, err := newHotTier(HotKeyConfig{Enabled: true, Threshold: 100, Window: window, MaxKeys: 1}) // 10 checks a window
		if err != nil {
			t.Fatal(err)
		}
		p := params(t, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 1000, Window: time.Minute})
		short := params(t, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 1000, Window: 500 * time.Millisecond})
		observe := func(key string, p *algorithm.Params, n int) *hotKey {
			var hk *hotKey
			for range n {
				hk = tier.observe(&store.Request{Key: key, Params: p, Cost: 1})
			}
			return hk
		}
		if hk := observe("a", p, 9); hk != nil {
			t.Fatal("hot after 9 checks, want 10")
		}
		hk := observe("a", p, 1)
		if hk == nil || hk.key != "a" {
			t.Fatalf("10 checks in a window: %v, want the key hot", hk)
		}
		if observe("b", p, 20) != nil {
			t.Error("a second hot key with MaxKeys 1")
		}
		if observe("c", short, 20) != nil {
			t.Error("hot with a window of 500ms, under 40 sync intervals of 20ms")
		}
		for _, c := range []struct {
			after  time.Duration
			checks int
			hot    bool
		}{
			{0, 0, true},      // promoted in this window: not yet counted for a whole one
			{window, 5, true}, // half the promotion count
			{window, 4, false},
		} {
			time.Sleep(c.after)
			observe("a", p, c.checks)
			tier.cool()
			if _, hot := (*tier.keys.Load())["a"]; hot != c.hot {
				t.Errorf("a window of %d checks: hot %v, want %v", c.checks, hot, c.hot)
			}
		}
	})
}
