package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
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

// TestMaybeCountedMarks: at fixed instants, a mark per request of positive
// cost given up on, one taken per request of its key, forgotten after the
// ttl.
func TestMaybeCountedMarks(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	m := maybeCounted{ttl: 5 * time.Second}
	req := func(key string, cost int64) store.Request { return store.Request{Key: key, Cost: cost} }
	m.mark([]store.Request{req("a", 1), req("a", 2), req("b", 1), req("read", 0)}, t0)
	if got := m.n.Load(); got != 3 {
		t.Fatalf("marks %d after 3 requests of positive cost, want 3", got)
	}
	for i, c := range []struct {
		reqs []store.Request
		now  time.Duration
		want bool
	}{
		{[]store.Request{req("read", 1)}, time.Second, false}, // a read marks nothing
		{[]store.Request{req("a", 0)}, time.Second, false},    // nor is refused
		{[]store.Request{req("c", 1)}, time.Second, false},
		{[]store.Request{req("a", 1), req("b", 1)}, time.Second, true}, // one of a, the one of b
		{[]store.Request{req("b", 1)}, time.Second, false},
		{[]store.Request{req("a", 1)}, 5 * time.Second, false}, // the second of a is forgotten
	} {
		if got := m.take(c.reqs, at(c.now)); got != c.want {
			t.Errorf("take %d at %s = %v, want %v", i, c.now, got, c.want)
		}
	}
	if got := m.n.Load(); got != 0 {
		t.Errorf("marks %d left, want 0", got)
	}
	// At most maxMarks keys: beyond, a key is not remembered until the
	// older marks expire.
	reqs := make([]store.Request, maxMarks)
	for i := range reqs {
		reqs[i] = req(strconv.Itoa(i), 1)
	}
	m.mark(reqs, at(10*time.Second))
	m.mark([]store.Request{req("late", 1)}, at(11*time.Second))
	if m.take([]store.Request{req("late", 1)}, at(11*time.Second)) {
		t.Error("a key beyond maxMarks was remembered")
	}
	m.mark([]store.Request{req("later", 1)}, at(15*time.Second))
	if !m.take([]store.Request{req("later", 1)}, at(15*time.Second)) || m.n.Load() != 0 {
		t.Errorf("a key once the full map expired: not remembered, or %d marks left", m.n.Load())
	}
}

// TestLocalGate runs the engine on a guard with its local limiter behind
// the guard's gate, in a testing/synctest bubble: a check whose call the
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
		newEngine := func(cfg Config) (*engine.Engine, *Guard) {
			cfg.Deadline, cfg.Breaker = time.Second, BreakerConfig{Disabled: true}
			g := newGuard(t, f, cfg)
			e, err := engine.New(engine.Config{Store: g, Local: g.Local(newMemory(t, nil)), Policy: pol})
			if err != nil {
				t.Fatal(err)
			}
			return e, g
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
			e, g := newEngine(Config{Gatherers: gatherers, StallTimeout: -1})
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
			if n := g.maybe.n.Load(); n != 0 {
				t.Errorf("gatherers %d: %d marks left, want 0", gatherers, n)
			}
		}
		// A store that heeds its context and answers past the deadline
		// returns at the deadline, as the guard gives up: either way the
		// call was sent.
		f.SetDown(false)
		for _, gatherers := range []int{-1, 1} {
			f.SetHang(0)
			e, _ := newEngine(Config{Gatherers: gatherers, StallTimeout: -1})
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
		e, _ := newEngine(Config{Deadline: 5 * time.Second, StallTimeout: 500 * time.Millisecond})
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

// TestMaybeCountedNeedsLocal: a guard whose local limiter is not behind
// its gate keeps no marks, and its error still says that the store may
// have counted the call.
func TestMaybeCountedNeedsLocal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		g := newGuard(t, f, Config{Deadline: time.Second, Breaker: BreakerConfig{Disabled: true}})
		p := params(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})
		f.SetHang(3 * time.Second)
		if _, _, err := check1(context.Background(), g, "k", p, 1); !errors.Is(err, ErrMaybeCounted) || !errors.Is(err, ErrDeadline) {
			t.Errorf("err %v, want ErrDeadline and ErrMaybeCounted", err)
		}
		if n := g.maybe.n.Load(); n != 0 {
			t.Errorf("%d marks kept with no gate, want 0", n)
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
		{fmt.Errorf("%w: %w", unavailable(context.DeadlineExceeded), store.ErrReplied), false}, // an answer
		{errors.New("bad request"), false},
	} {
		if got := errors.Is(sentErr(c.err), ErrMaybeCounted); got != c.want {
			t.Errorf("sentErr(%v) maybe counted = %v, want %v", c.err, got, c.want)
		}
	}
}
