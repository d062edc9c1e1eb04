package limiter

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// reset forgets keys, which an earlier run of the test (-count) may have
// left in the package's Redis.
func reset(t *testing.T, lim *Redis, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if err := lim.Reset(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisReserve checks reservations on Redis, at its clock: with 10 a
// second and a burst of 1, each reservation waits 100 ms after the one
// before, and a request meanwhile is denied.
func TestRedisReserve(t *testing.T) {
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		t.Run(a.String(), func(t *testing.T) {
			lim := newRedis(t, sluice.Limit{Algorithm: a, Limit: 10, Window: time.Second, Burst: 1})
			reset(t, lim, "k")
			if ok, err := lim.Allow(ctx, "warm"); !ok || err != nil {
				t.Fatalf("Allow = %v, %v", ok, err) // connects and loads the script
			}
			start := time.Now()
			for i := range 5 {
				r, err := lim.Reserve(ctx, "k")
				if err != nil || !r.OK() {
					t.Fatalf("reservation %d: OK %v, %v", i+1, r.OK(), err)
				}
				// The i-th unit is back i x 100 ms after the first
				// call, give or take the round trips.
				want := start.Add(time.Duration(i) * 100 * time.Millisecond)
				if got := time.Now().Add(r.Delay()); got.Before(want.Add(-5*time.Millisecond)) || got.After(want.Add(50*time.Millisecond)) {
					t.Errorf("reservation %d: usable %s after the start, want %s", i+1, got.Sub(start), want.Sub(start))
				}
			}
			if ok, err := lim.Allow(ctx, "k"); ok || err != nil {
				t.Errorf("Allow behind 5 reservations = %v, %v; want false", ok, err)
			}
		})
	}
}

// TestRedisReserveShared checks reservations made concurrently through two
// clients: each holds its own unit, so their instants are an emission
// interval (50 ms) apart, and the key is spent until the last.
func TestRedisReserveShared(t *testing.T) {
	ctx := context.Background()
	l := sluice.Limit{Algorithm: sluice.GCRA, Limit: 20, Window: time.Second, Burst: 1}
	lims := []*Redis{newRedis(t, l), newRedis(t, l)}
	reset(t, lims[0], "k")
	var mu sync.Mutex
	var at []time.Time
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			r, err := lims[i%2].Reserve(ctx, "k")
			if err != nil || !r.OK() {
				t.Errorf("Reserve: OK %v, %v", r.OK(), err)
				return
			}
			mu.Lock()
			at = append(at, time.Now().Add(r.Delay()))
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(at, time.Time.Compare)
	if len(at) != 20 {
		t.Fatalf("%d reservations, want 20", len(at))
	}
	// 20 units at 50 ms intervals: 950 ms from the first to the last,
	// less what the answers' arrival spreads.
	if span := at[19].Sub(at[0]); span < 900*time.Millisecond {
		t.Errorf("20 reservations span %s, want about 950ms", span)
	}
	d, err := lims[0].Decide(ctx, "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Restored an emission interval after the last reserved instant.
	if until := time.Until(at[19]); d.Remaining != 0 || d.ResetAfter < until {
		t.Errorf("after 20 reservations: %+v, want nothing remaining for over %s", d, until)
	}
}

// TestRedisReserveWindows: the window algorithms reserve only the units
// there now.
func TestRedisReserveWindows(t *testing.T) {
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter, sluice.SlidingWindowLog} {
		t.Run(a.String(), func(t *testing.T) {
			lim := newRedis(t, sluice.Limit{Algorithm: a, Limit: 2, Window: time.Hour})
			reset(t, lim, "k")
			for i := range 2 {
				if r, err := lim.Reserve(ctx, "k"); err != nil || !r.OK() || r.Delay() != 0 {
					t.Fatalf("reservation %d: OK %v, delay %s, %v; want OK at once", i+1, r.OK(), r.Delay(), err)
				}
			}
			if r, err := lim.Reserve(ctx, "k"); r.OK() || err == nil {
				t.Errorf("third reservation: OK %v, %v; want not OK and an error", r.OK(), err)
			}
		})
	}
}

// TestRedisWait checks Wait on Redis: spread as the limit says on a bucket
// and on a log, refused at once past the deadline, and failing with
// ErrStoreUnavailable when Redis cannot answer.
func TestRedisWait(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps")
	}
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.SlidingWindowLog} {
		lim := newRedis(t, sluice.Limit{Algorithm: a, Limit: 1, Window: 100 * time.Millisecond}, WithPrefix(t.Name()+a.String()))
		reset(t, lim, "k")
		start := time.Now()
		for i := range 4 {
			if err := lim.Wait(ctx, "k"); err != nil {
				t.Fatalf("%s: Wait %d: %v", a, i+1, err)
			}
		}
		if el := time.Since(start); el < 280*time.Millisecond || el > 2*time.Second {
			t.Errorf("%s: 4 Waits took %s, want about 300ms", a, el)
		}
	}

	lim := newRedis(t, PerMinute(1))
	reset(t, lim, "d")
	if err := lim.Wait(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := lim.Wait(dctx, "d"); !errors.Is(err, ErrBeyondDeadline) {
		t.Errorf("Wait with a 1 s deadline for a unit back in a minute = %v, want ErrBeyondDeadline", err)
	}
	if err := lim.WaitN(ctx, "d", 2); !errors.Is(err, ErrNeverAdmitted) {
		t.Errorf("WaitN(2) with a burst of 1 = %v, want ErrNeverAdmitted", err)
	}

	srv := redistest.Start(t)
	down, err := NewRedis(newClient(t, srv.Addr), PerMinute(1), WithTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if err := down.Wait(ctx, "k"); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Wait with Redis down = %v, want ErrStoreUnavailable", err)
	}
}
