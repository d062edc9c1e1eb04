package limiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// ms returns the instant m milliseconds after t0.
func ms(m int) time.Time { return t0.Add(time.Duration(m) * time.Millisecond) }

// TestReserve checks reservations at fixed instants, as
// golang.org/x/time/rate's Reserve makes them for rate.NewLimiter(1, 2):
// two at once, then one a second, each after the one before, and a
// request that arrives meanwhile waits its turn behind them.
func TestReserve(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		t.Run(a.String(), func(t *testing.T) {
			lim := newLimiter(t, sluice.Limit{Algorithm: a, Limit: 2, Window: 2 * time.Second}, Config{})
			for i, want := range []time.Duration{0, 0, time.Second, 2 * time.Second, 3 * time.Second} {
				r := lim.ReserveN("k", t0, 1)
				if !r.OK() || r.DelayFrom(t0) != want {
					t.Fatalf("reservation %d: OK %v, delay %s; want OK, %s", i+1, r.OK(), r.DelayFrom(t0), want)
				}
			}
			// Four reserved units are back at 4 s: the fifth's turn is
			// 3 s, the next one at 4 s.
			for _, c := range []struct {
				at   int
				want bool
			}{{3900, false}, {4000, true}, {4500, false}, {5000, true}} {
				if got := lim.AllowAt("k", ms(c.at)); got != c.want {
					t.Errorf("AllowAt(%d ms) = %v, want %v", c.at, got, c.want)
				}
			}
			// A reservation at a later instant counts from there.
			if d := lim.ReserveN("k", ms(5000), 1).DelayFrom(ms(5000)); d != time.Second {
				t.Errorf("reservation at 5 s: delay %s, want 1s", d)
			}
		})
	}
}

// TestReserveWindows checks that the window algorithms reserve only units
// there now, so that the present never admits beyond the limit.
func TestReserveWindows(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter, sluice.SlidingWindowLog} {
		t.Run(a.String(), func(t *testing.T) {
			lim := newLimiter(t, sluice.Limit{Algorithm: a, Limit: 2, Window: 10 * time.Second}, Config{})
			for i := range 2 {
				if r := lim.ReserveN("k", t0, 1); !r.OK() || r.DelayFrom(t0) != 0 {
					t.Fatalf("reservation %d: OK %v, delay %s; want OK, 0", i+1, r.OK(), r.DelayFrom(t0))
				}
			}
			r := lim.ReserveN("k", t0, 1)
			if r.OK() || r.DelayFrom(t0) != math.MaxInt64 {
				t.Errorf("third reservation: OK %v, delay %s; want not OK", r.OK(), r.DelayFrom(t0))
			}
			if lim.AllowAt("k", ms(5000)) {
				t.Error("AllowAt(5 s) = true after a full window, want false")
			}
		})
	}
}

// TestReserveNeverAdmitted: a cost above the burst, a negative cost and a
// deny-all limit give a reservation that is not OK and consume nothing.
func TestReserveNeverAdmitted(t *testing.T) {
	lim := newLimiter(t, PerSecond(5), Config{})
	for _, n := range []int64{6, -1} {
		if r := lim.ReserveN("k", t0, n); r.OK() {
			t.Errorf("ReserveN(%d) of a burst of 5: OK, want not OK", n)
		}
	}
	if got := lim.DecideAt("k", t0, 0).Remaining; got != 5 {
		t.Errorf("remaining after refused reservations = %d, want 5", got)
	}
	if r := lim.ReserveN("k", t0, 0); !r.OK() || r.DelayFrom(t0) != 0 {
		t.Errorf("ReserveN(0): OK %v, delay %s; want OK at once", r.OK(), r.DelayFrom(t0))
	}
	deny := newLimiter(t, sluice.Limit{Algorithm: sluice.GCRA, Window: time.Second, DenyAll: true}, Config{})
	if r := deny.Reserve("k"); r.OK() {
		t.Error("Reserve of a deny-all limit: OK, want not OK")
	}
	err := lim.WaitN(context.Background(), "k", 6)
	if !errors.Is(err, ErrNeverAdmitted) {
		t.Errorf("WaitN(6) of a burst of 5 = %v, want ErrNeverAdmitted", err)
	}
}

// TestReserveUsesClock checks that Reserve and Delay read the Config's
// clock.
func TestReserveUsesClock(t *testing.T) {
	var now atomic.Pointer[time.Time]
	set := func(t time.Time) { now.Store(&t) }
	set(t0)
	lim := newLimiter(t, PerSecond(1), Config{Now: func() time.Time { return *now.Load() }})
	lim.Reserve("k")
	r := lim.Reserve("k")
	if d := r.Delay(); d != time.Second {
		t.Errorf("Delay() = %s, want 1s", d)
	}
	set(ms(400))
	if d := r.Delay(); d != 600*time.Millisecond {
		t.Errorf("Delay() 400 ms later = %s, want 600ms", d)
	}
}

// TestWait checks that Wait sleeps until the units are back, on every
// algorithm, and that the waiters of a limit of 10 a second through a
// burst of 1 are spread as the limit says.
func TestWait(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps")
	}
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			// 1 per 100 ms for the buckets; 1 per 100 ms window for
			// the windows.
			l := sluice.Limit{Algorithm: a, Limit: 1, Window: 100 * time.Millisecond}
			lim := newLimiter(t, l, Config{})
			ctx := context.Background()
			start := time.Now()
			for i := range 4 {
				if err := lim.Wait(ctx, "k"); err != nil {
					t.Fatalf("Wait %d: %v", i+1, err)
				}
			}
			// Three waits of 100 ms (the first is at once; a window's
			// first may come sooner, its window having started before).
			if el := time.Since(start); el < 200*time.Millisecond || el > 2*time.Second {
				t.Errorf("4 Waits took %s, want about 300ms", el)
			}
		})
	}
}

// TestWaitConcurrent checks that concurrent Waits are admitted in turn,
// one per emission interval, never two at once.
func TestWaitConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps")
	}
	lim := newLimiter(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 20, Window: time.Second, Burst: 1}, Config{})
	var mu sync.Mutex
	var at []time.Time
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := lim.Wait(context.Background(), "k"); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			at = append(at, time.Now())
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(at) != 8 {
		t.Fatalf("%d waits returned, want 8", len(at))
	}
	first, last := at[0], at[0]
	for _, a := range at {
		first, last = minTime(first, a), maxTime(last, a)
	}
	// 8 admitted at 50 ms intervals: 350 ms from the first to the last.
	if span := last.Sub(first); span < 300*time.Millisecond {
		t.Errorf("8 waiters admitted over %s, want at least 350ms less timer slack", span)
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestWaitDeadline checks that a Wait whose units are back only after the
// context's deadline returns at once, with ErrBeyondDeadline (which wraps
// context.DeadlineExceeded), and reserves nothing.
func TestWaitDeadline(t *testing.T) {
	lim := newLimiter(t, PerMinute(1), Config{})
	ctx := context.Background()
	if err := lim.Wait(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	err := lim.Wait(dctx, "k")
	if !errors.Is(err, ErrBeyondDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with a 1 s deadline for a unit back in a minute = %v, want ErrBeyondDeadline", err)
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Errorf("Wait took %s to refuse, want at once", el)
	}
	// Nothing was reserved: the next unit is still back within a minute.
	if d := lim.Reserve("k").Delay(); d > time.Minute || d < 58*time.Second {
		t.Errorf("after the refused Wait, a reservation waits %s, want just under a minute", d)
	}
	cancel()
	if err := lim.Wait(dctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with a cancelled context = %v, want context.Canceled", err)
	}
}
