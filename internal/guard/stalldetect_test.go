package guard

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
)

// TestStallDetectorLearns feeds a stall detector answers at fixed instants
// and reads the timeout it learns: four times the slowest answer of the
// last one to two epochs, at least the floor, off when it would reach the
// deadline.
func TestStallDetectorLearns(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var s stallDetector
	s.deadline = 5 * time.Second
	steps := []struct {
		sent, got time.Duration // the answer's send and receive instants, from t0
		want      time.Duration // the timeout after it
	}{
		{0, 10 * time.Millisecond, DefaultStallFloor},                              // fast: the floor
		{time.Second, time.Second + 400*time.Millisecond, 1600 * time.Millisecond}, // 4 x 400 ms
		{2 * time.Second, 2*time.Second + 100*time.Millisecond, 1600 * time.Millisecond},
		{11 * time.Second, 11*time.Second + 50*time.Millisecond, 1600 * time.Millisecond}, // a new epoch keeps the last one's slowest
		{22 * time.Second, 22*time.Second + 50*time.Millisecond, DefaultStallFloor},       // two epochs on, the 400 ms is forgotten
		{23 * time.Second, 25 * time.Second, 0},                                           // 4 x 2 s reaches the deadline: off
	}
	for i, st := range steps {
		s.answered(at(st.sent), at(st.got))
		if got := s.timeout(); got != st.want {
			t.Errorf("step %d: answer of %s: timeout %s, want %s", i, st.got-st.sent, got, st.want)
		}
	}
	for _, fixed := range []time.Duration{-1, 2 * time.Second, 5 * time.Second} {
		s := stallDetector{fixed: fixed, deadline: 5 * time.Second}
		want := fixed
		if fixed < 0 || fixed >= s.deadline {
			want = 0
		}
		if got := s.timeout(); got != want {
			t.Errorf("fixed %s: timeout %s, want %s", fixed, got, want)
		}
	}
}

// TestStallDetectorStalledAndBlocked: a call gives up when the store has
// answered nothing for the timeout since the later of the call's start and
// the store's last answer; after that, calls fail at once but for one
// probe per timeout, until the store answers again.
func TestStallDetectorStalledAndBlocked(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const timeout = time.Second
	var s stallDetector
	if s.stalled(t0, at(time.Hour), timeout) {
		t.Error("stalled before the store's first answer")
	}
	s.answered(t0, at(10*time.Millisecond))
	for _, c := range []struct {
		start, now time.Duration
		want       bool
	}{
		{0, 999 * time.Millisecond, false},
		{0, 1010 * time.Millisecond, true},                             // a second after the last answer
		{5 * time.Second, 5*time.Second + 999*time.Millisecond, false}, // idle before the call is no stall
		{5 * time.Second, 6 * time.Second, true},
		{0, time.Hour, false}, // no timeout: never
	} {
		tm := timeout
		if c.now == time.Hour {
			tm = 0
		}
		if got := s.stalled(at(c.start), at(c.now), tm); got != c.want {
			t.Errorf("stalled(start %s, now %s) = %v, want %v", c.start, c.now, got, c.want)
		}
	}
	if got, want := s.wakeAt(at(5*time.Second), timeout), at(6*time.Second); !got.Equal(want) {
		t.Errorf("wakeAt = %s, want %s", got, want)
	}
	if s.blocked(at(2*time.Second), timeout) {
		t.Error("blocked before any call gave up")
	}
	s.trip(at(2 * time.Second))
	for _, c := range []struct {
		now  time.Duration
		want bool
	}{
		{2 * time.Second, false},                     // the first call after the trip probes
		{2*time.Second + 500*time.Millisecond, true}, // the others fail at once
		{3 * time.Second, false},                     // one probe per timeout
		{3*time.Second + time.Millisecond, true},
	} {
		if got := s.blocked(at(c.now), timeout); got != c.want {
			t.Errorf("after a stall, blocked at %s = %v, want %v", c.now, got, c.want)
		}
	}
	s.answered(at(3*time.Second), at(3*time.Second+10*time.Millisecond))
	if s.blocked(at(3*time.Second+20*time.Millisecond), timeout) {
		t.Error("blocked after the store answered again")
	}
}

// TestStallEndsTheWait runs in a testing/synctest bubble: a store that
// answered promptly and then hangs has its calls given up at the learned
// stall timeout (the floor, 1 s), long before the 5 s deadline; after one
// probe, calls fail at once, and once the store answers again they go
// through.
func TestStallEndsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1 << 30, Window: time.Second})
		for _, gatherers := range []int{0, -1} {
			f.SetHang(0)
			g := newGuard(t, f, Config{Deadline: 5 * time.Second, Gatherers: gatherers, Breaker: BreakerConfig{Disabled: true}})
			ctx := context.Background()
			if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
				t.Fatal(err)
			}
			f.SetHang(3 * time.Second)
			start := time.Now()
			_, _, err := check1(ctx, g, "k", p, 1)
			if took, most := time.Since(start), DefaultStallFloor+g.sweepEvery(); !errors.Is(err, ErrStalled) || took < DefaultStallFloor || took > most {
				t.Errorf("gatherers %d: store hangs: err %v after %s, want ErrStalled after [%s, %s]", gatherers, err, took, DefaultStallFloor, most)
			}
			// The next call probes the store (and stalls too); the others
			// made while it waits fail at once.
			probed := make(chan error)
			go func() { _, _, err := check1(ctx, g, "k", p, 1); probed <- err }()
			synctest.Wait()
			start = time.Now()
			if _, _, err := check1(ctx, g, "k", p, 1); !errors.Is(err, ErrStalled) || time.Since(start) != 0 {
				t.Errorf("gatherers %d: during the probe of a stalled store: err %v after %s, want ErrStalled at once", gatherers, err, time.Since(start))
			}
			if err := <-probed; !errors.Is(err, ErrStalled) {
				t.Errorf("gatherers %d: probe of a stalled store: err %v, want ErrStalled", gatherers, err)
			}
			f.SetHang(0)
			time.Sleep(6 * time.Second) // the hung calls return: the store answered
			if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
				t.Errorf("gatherers %d: store back: %v", gatherers, err)
			}
		}
	})
}
