package limiter

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
	"github.com/sluicehq/sluice/store/memory"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newLimiter(t testing.TB, l sluice.Limit, cfg Config) *Limiter {
	t.Helper()
	lim, err := New(l, cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", l, err)
	}
	return lim
}

// sec returns the instant s seconds after t0.
func sec(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// TestSeedExample replays the example of the library specification: two
// requests per five seconds, on the sliding window log.
func TestSeedExample(t *testing.T) {
	lim := newLimiter(t, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 2, Window: 5 * time.Second}, Config{})
	for _, tc := range []struct {
		key  string
		at   int
		want bool
	}{
		{"A", 1, true},
		{"A", 2, true},
		{"A", 3, false},
		{"B", 3, true}, // keys do not share state
		{"A", 6, true}, // the request at 1 left the window at 6
		{"A", 7, true},
		{"A", 8, false},
	} {
		if got := lim.AllowAt(tc.key, sec(tc.at)); got != tc.want {
			t.Errorf("AllowAt(%q, %d) = %v, want %v", tc.key, tc.at, got, tc.want)
		}
	}
}

// TestEdgeCases covers the edge cases of the specification for every
// algorithm: first request, many at one instant, one more after the burst,
// a request a whole window later, long inactivity, keys kept apart.
func TestEdgeCases(t *testing.T) {
	const n = 100
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			lim := newLimiter(t, sluice.Limit{Algorithm: a, Limit: n, Window: time.Minute}, Config{})
			if !lim.AllowAt("u", sec(0)) {
				t.Fatal("first request denied")
			}
			for i := 1; i < n; i++ {
				if !lim.AllowAt("u", sec(0)) {
					t.Fatalf("request %d of %d at one instant denied", i+1, n)
				}
			}
			if lim.AllowAt("u", sec(0)) {
				t.Fatalf("request %d at one instant allowed", n+1)
			}
			if !lim.AllowAt("v", sec(0)) {
				t.Fatal("another key's first request denied")
			}
			if !lim.AllowN("u", sec(120), n) {
				t.Fatalf("a full limit two windows later denied")
			}
			if !lim.AllowN("u", sec(3600), n) {
				t.Fatalf("a full limit after an hour of inactivity denied")
			}
			d := lim.DecideAt("u", sec(3600), 1)
			if d.Allowed || d.Reason != sluice.ReasonLimited || d.RetryAfter <= 0 {
				t.Errorf("one more after the limit: %+v, want denied, limited, with a retry-after", d)
			}
			d = lim.DecideAt("w", sec(0), n+1)
			if d.Allowed || d.Reason != sluice.ReasonCostExceedsCapacity || d.RetryAfter != 0 {
				t.Errorf("cost above the limit: %+v, want denied for cost_exceeds_capacity with no retry-after", d)
			}
		})
	}
}

func TestCosts(t *testing.T) {
	lim := newLimiter(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 10, Window: time.Minute}, Config{})
	if !lim.AllowN("a", t0, 0) {
		t.Error("AllowN(0) on a fresh key = false, want true")
	}
	if lim.AllowN("a", t0, -1) {
		t.Error("AllowN(-1) = true, want false")
	}
	if d := lim.DecideAt("a", t0, -1); d.Allowed || d.Reason != sluice.ReasonCostExceedsCapacity {
		t.Errorf("DecideAt(-1) = %+v, want denied for cost_exceeds_capacity", d)
	}
	if got := lim.DecideAt("a", t0, 0).Remaining; got != 10 {
		t.Errorf("remaining after reads only = %d, want 10", got)
	}
	if !lim.AllowN("a", t0, 10) || lim.AllowN("a", t0, 1) {
		t.Error("cost 10 then 1 at one instant: want allowed then denied")
	}
	lim.Reset("a")
	if got := lim.DecideAt("a", t0, 0).Remaining; got != 10 {
		t.Errorf("remaining after Reset = %d, want 10", got)
	}
}

func TestAllowUsesClock(t *testing.T) {
	var now atomic.Int64
	now.Store(t0.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	lim := newLimiter(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 2, Window: time.Second}, Config{Now: clock})
	for i, want := range []bool{true, true, false} {
		if got := lim.Allow("k"); got != want {
			t.Errorf("Allow #%d = %v, want %v", i+1, got, want)
		}
	}
	if lim.AllowAt("k", time.Time{}) {
		t.Error("AllowAt with a zero time in an exhausted window = true, want false")
	}
	now.Store(t0.Add(time.Second).UnixNano())
	if !lim.Allow("k") {
		t.Error("Allow in the next window = false, want true")
	}
}

func TestInvalidLimits(t *testing.T) {
	for _, tc := range []struct {
		l     sluice.Limit
		field string
	}{
		{sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 0, Window: time.Second}, "limit"},
		{sluice.Limit{Algorithm: sluice.TokenBucket, Limit: -5, Window: time.Second}, "limit"},
		{sluice.Limit{Algorithm: sluice.GCRA, Limit: 5, Window: 0}, "window"},
		{sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: -time.Second}, "window"},
		{sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: 400 * 24 * time.Hour}, "window"},
		{sluice.Limit{Algorithm: sluice.LeakyBucket, Limit: 5, Window: time.Second, Burst: -1}, "burst"},
		{sluice.Limit{Algorithm: 0, Limit: 5, Window: time.Second}, "algorithm"},
	} {
		_, err := New(tc.l, Config{})
		if !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("New(%+v): error %v, want one wrapping ErrInvalidLimit", tc.l, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v): error %q does not name %q", tc.l, err, tc.field)
		}
	}
	_, err := New(sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 1000, Window: time.Second}, Config{MaxLogEntries: 999})
	if !errors.Is(err, memory.ErrLogTooLarge) || !strings.Contains(err.Error(), "sliding_window_counter") {
		t.Errorf("a log above MaxLogEntries: error %v, want ErrLogTooLarge naming sliding_window_counter", err)
	}
	if _, err := New(sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 5, Window: time.Second}, Config{MaxKeys: -1}); err == nil {
		t.Error("New with MaxKeys -1 succeeded, want an error")
	}
}

// TestConcurrent checks, under the race detector, that goroutines sharing
// keys at a frozen instant admit exactly the limit of each key.
func TestConcurrent(t *testing.T) {
	const keys, goroutines, each, n = 20, 8, 100, 25
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			lim := newLimiter(t, sluice.Limit{Algorithm: a, Limit: n, Window: time.Hour}, Config{MaxKeys: 1000})
			var admitted [keys]atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						k := (g + i) % keys
						if lim.AllowAt(fmt.Sprint("key-", k), t0) {
							admitted[k].Add(1)
						}
					}
				}()
			}
			wg.Wait()
			for k := range admitted {
				// Every key saw goroutines*each/keys = 40 requests.
				if got := admitted[k].Load(); got != n {
					t.Errorf("key-%d: admitted %d, want %d", k, got, n)
				}
			}
		})
	}
}

func TestMaxKeys(t *testing.T) {
	lim := newLimiter(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 5, Window: time.Second}, Config{MaxKeys: 500})
	for i := range 5000 {
		lim.AllowAt(fmt.Sprint("k", i), t0)
	}
	if got := lim.Len(); got != 500 {
		t.Errorf("Len() = %d after 5000 keys, want the cap 500", got)
	}
}

func TestDoesNotAllocate(t *testing.T) {
	for _, a := range sluice.Algorithms {
		if a == sluice.SlidingWindowLog {
			continue
		}
		lim := newLimiter(t, sluice.Limit{Algorithm: a, Limit: 1000, Window: time.Second}, Config{})
		at := t0
		allocs := testing.AllocsPerRun(1000, func() {
			at = at.Add(time.Millisecond)
			lim.AllowAt("user-42", at)
			lim.DecideAt("user-43", at, 2)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per call, want 0", a, allocs)
		}
	}
}

func ExampleLimiter() {
	lim, err := New(sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 2, Window: 5 * time.Second}, Config{})
	if err != nil {
		panic(err)
	}
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	fmt.Println(lim.AllowAt("A", at(1)))
	fmt.Println(lim.AllowAt("A", at(2)))
	fmt.Println(lim.AllowAt("A", at(3)))
	fmt.Println(lim.AllowAt("A", at(6)))
	// Output:
	// true
	// true
	// false
	// true
}

func TestDecide(t *testing.T) {
	lim := newLimiter(t, PerMinute(2), Config{Now: func() time.Time { return t0 }})
	for i, want := range []bool{true, true, false} {
		d, err := lim.Decide(context.Background(), "k", 1)
		if err != nil || d.Allowed != want {
			t.Errorf("Decide #%d = %+v, %v; want allowed %v", i+1, d, err, want)
		}
	}
}

// ReserveN at fixed instants: 2 a second, with bursts of 2, lets two go at
// once and reserves the next ones 500 ms apart, as
// golang.org/x/time/rate's Reserve does for rate.NewLimiter(2, 2).
func ExampleLimiter_ReserveN() {
	lim, err := New(PerSecond(2), Config{})
	if err != nil {
		panic(err)
	}
	now := time.Unix(1_800_000_000, 0)
	for range 4 {
		r := lim.ReserveN("upload", now, 1)
		fmt.Println("act in", r.DelayFrom(now))
	}
	// Output:
	// act in 0s
	// act in 0s
	// act in 500ms
	// act in 1s
}
