package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
)

// TestLocalGate runs the engine on a guard, in a testing/synctest
// bubble, with a rule whose failure mode is local: a check whose call the
// guard gave up on after sending it (a store that hangs: past the
// deadline, or stalled) fails closed, since the store may count it; a
// check the store could not be reached for (down), one that failed at once
// on a stalled store, and one given up on before it was sent are decided
// by the local limiter.
func TestLocalGate(t *testing.T) {
	pol, err := policy.Parse("t.yaml", []byte(`version: 1
rules:
  - { id: loc, match: { resource: /loc }, algorithm: fixed_window, limit: 100, window: 1h, failure_mode: local }
`))
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		newEngine := func(cfg Config) *engine.Engine {
			cfg.Deadline, cfg.Breaker = time.Second, BreakerConfig{Disabled: true}
			g := newGuard(t, f, cfg)
			e, err := engine.New(engine.Config{Store: g, MaybeCountedFailsClosed: true, Policy: pol})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
		ctx := context.Background()
		check := func(e *engine.Engine) string {
			t.Helper()
			r, err := e.Check(ctx, &engine.Check{ClientID: "c", Resource: "/loc", Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			return r.Source.String() + "/" + r.Fallback.String()
		}
		// Past the deadline: a check of its own, then gathered ones,
		// the second queued behind the first (one gatherer) and given up
		// on before it was sent.
		for _, gatherers := range []int{-1, 1} {
			f.SetDown(false)
			f.SetHang(0)
			e := newEngine(Config{Gatherers: gatherers, StallTimeout: -1})
			if got := check(e); got != "store/" {
				t.Fatalf("gatherers %d: store up: %s", gatherers, got)
			}
			f.SetHang(3 * time.Second)
			var got [2]string
			var wg sync.WaitGroup
			for i := range got {
				wg.Go(func() { got[i] = check(e) })
				synctest.Wait()
			}
			wg.Wait()
			want := [2]string{"fail_closed/deadline", "local/deadline"}
			if gatherers < 0 {
				want[1] = "fail_closed/deadline" // each sent on its own
			}
			if got != want {
				t.Errorf("gatherers %d: store hangs: %v, want %v", gatherers, got, want)
			}
			time.Sleep(3 * time.Second)
			f.SetHang(0)
			f.SetDown(true)
			if got := check(e); got != "local/unreachable" {
				t.Errorf("gatherers %d: store down: %s, want local/unreachable", gatherers, got)
			}
		}
		// A store that heeds its context and answers past the deadline
		// returns at the deadline, as the guard gives up: either way the
		// call was sent.
		f.SetDown(false)
		for _, gatherers := range []int{-1, 1} {
			f.SetHang(0)
			e := newEngine(Config{Gatherers: gatherers, StallTimeout: -1})
			if got := check(e); got != "store/" {
				t.Fatalf("gatherers %d: store up: %s", gatherers, got)
			}
			f.SetDelay(3 * time.Second)
			if got := check(e); got != "fail_closed/deadline" {
				t.Errorf("gatherers %d: store slow: %s, want fail_closed/deadline", gatherers, got)
			}
			f.SetDelay(0)
		}
		// A stalled store: the calls that stall fail closed; those that
		// fail at once are decided locally.
		e := newEngine(Config{Deadline: 5 * time.Second, StallTimeout: 500 * time.Millisecond})
		if got := check(e); got != "store/" {
			t.Fatalf("store up: %s", got)
		}
		f.SetHang(3 * time.Second)
		if got := check(e); got != "fail_closed/stalled" {
			t.Errorf("stalled store, the call that stalls: %s, want fail_closed/stalled", got)
		}
		// The next call probes the store (and stalls too); the others
		// made while it waits fail at once.
		probed := make(chan string)
		go func() { probed <- check(e) }()
		synctest.Wait()
		if got := check(e); got != "local/stalled" {
			t.Errorf("stalled store, a call that fails at once: %s, want local/stalled", got)
		}
		if got := <-probed; got != "fail_closed/stalled" {
			t.Errorf("stalled store, the probe: %s, want fail_closed/stalled", got)
		}
		time.Sleep(3 * time.Second)
	})
}

// TestMaybeCountedError: the error of a call given up on at the deadline
// after it was sent says that the store may have counted the call.
func TestMaybeCountedError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		g := newGuard(t, f, Config{Deadline: time.Second, Breaker: BreakerConfig{Disabled: true}})
		p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})
		f.SetHang(3 * time.Second)
		if _, _, err := check1(context.Background(), g, "k", p, 1); !errors.Is(err, ErrMaybeCounted) || !errors.Is(err, ErrDeadline) {
			t.Errorf("err %v, want ErrDeadline and ErrMaybeCounted", err)
		}
		time.Sleep(3 * time.Second)
	})
}

// TestSentErr: the error of a sent call that the store gave up on at its
// context's end says the store may have counted it; an answer, or a
// failure to reach the store, does not.
func TestSentErr(t *testing.T) {
	unavailable := func(err error) error { return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err) }
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{unavailable(context.DeadlineExceeded), true},
		{unavailable(context.Canceled), true},
		{unavailable(syscall.ECONNREFUSED), false},
		{unavailable(&net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}), false}, // never connected
		{unavailable(&net.OpError{Op: "read", Net: "tcp", Err: context.DeadlineExceeded}), true},
		{unavailable(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), true}, // an i/o timeout
		{unavailable(&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}), false},
		{fmt.Errorf("%w: %w", unavailable(context.DeadlineExceeded), store.ErrReplied), false}, // an answer
		{errors.New("bad request"), false},
	} {
		if got := errors.Is(sentErr(c.err), ErrMaybeCounted); got != c.want {
			t.Errorf("sentErr(%v) maybe counted = %v, want %v", c.err, got, c.want)
		}
	}
}
