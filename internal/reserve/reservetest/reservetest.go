// Package reservetest is the conformance suite of the backends of package
// reserve: Run drives a Keeper on a backend through grants, the queue,
// uses, releases, expiries, cancellations, a full queue, the weights of
// the fairness quotas over a long run, the aging bound of a low-priority
// request and a reload of the quotas, at instants the test chooses, so
// that the memory backend and Redis (standalone and cluster) provably
// serve reservations the same.
package reservetest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/reservation"
)

// Policy is the policy of the suite: one rule, a limit of 100 on /api/*,
// so that a pool has 100 tokens.
const Policy = `version: 1
rules:
  - {id: api, match: {resource: "/api/*"}, limit: 100, window: 1m, algorithm: fixed_window}
`

// Clock is a settable clock, at a fixed instant to begin with.
type Clock struct{ us atomic.Int64 }

// NewClock returns a Clock at 2027-01-15 08:00 UTC.
func NewClock() *Clock { c := &Clock{}; c.us.Store(1_800_000_000_000_000); return c }

// Now returns the clock's instant.
func (c *Clock) Now() time.Time { return time.UnixMicro(c.us.Load()) }

// Add moves the clock on by d.
func (c *Clock) Add(d time.Duration) { c.us.Add(d.Microseconds()) }

// Sink is an events.Sink that keeps what it receives.
type Sink struct {
	mu  sync.Mutex
	evs []events.Event
}

// Emit implements events.Sink.
func (s *Sink) Emit(ev *events.Event) {
	s.mu.Lock()
	s.evs = append(s.evs, *ev)
	s.mu.Unlock()
}

// Tokens returns the number of events of type t and the sum of their
// tokens.
func (s *Sink) Tokens(t events.Type) (n int, tokens int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range s.evs {
		if ev.Type == t {
			n++
			tokens += ev.Tokens
		}
	}
	return n, tokens
}

// NewKeeper returns a Keeper on b with the suite's policy, clock (nil for
// the backend's) and queue limit, no sweep of its own, and its Sink.
func NewKeeper(t testing.TB, b reserve.Backend, now func() time.Time, queue int64) (*reserve.Keeper, *Sink) {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(Policy))
	if err != nil {
		t.Fatal(err)
	}
	sink := &Sink{}
	k, err := reserve.New(reserve.Config{Policy: func() *policy.Policy { return p }, Now: now, QueueLimit: queue,
		SweepEvery: -1, Backend: b, Events: events.New(events.Config{Sinks: []events.Sink{sink}})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k, sink
}

// Ask returns a reservation of tokens for d by client on /api/orders.
func Ask(client string, tokens int64, d time.Duration) reserve.Ask {
	return reserve.Ask{Client: client, Resource: "/api/orders", Tokens: tokens, Duration: d, Priority: reservation.Normal}
}

// Run runs the suite on the backends newBackend returns, a fresh one
// (with no pools) for each test.
func Run(t *testing.T, newBackend func(t *testing.T) reserve.Backend) {
	t.Run("GrantQueueUseRelease", func(t *testing.T) { testGrantQueueUseRelease(t, newBackend(t)) })
	t.Run("ExpiryReturnsUnusedOnce", func(t *testing.T) { testExpiry(t, newBackend(t)) })
	t.Run("CancelAndQueueFull", func(t *testing.T) { testCancelQueueFull(t, newBackend(t)) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, newBackend(t)) })
	t.Run("Fairness", func(t *testing.T) { testFairness(t, newBackend(t)) })
	t.Run("Aging", func(t *testing.T) { testAging(t, newBackend(t)) })
	t.Run("Reload", func(t *testing.T) { testReload(t, newBackend(t)) })
}

// testFairness holds the tokens granted to the clients of FairPolicy to
// their weights 1:2:4, within 5%, over FairnessGrants grants: of one
// token each, and of sizes that differ by client.
func testFairness(t *testing.T, b reserve.Backend) {
	for _, sizes := range []map[string]int64{{"w1": 1, "w2": 1, "w4": 1}, {"w1": 3, "w2": 1, "w4": 2}} {
		start := time.Now()
		sh := Fairness(t, b, sizes)
		t.Logf("requests of %v tokens: %s, in %s", sizes, sh, time.Since(start).Round(time.Millisecond))
		if sh.Deviation > 0.05 {
			t.Errorf("requests of %v tokens: %s: a share deviates by more than 5%%", sizes, sh)
		}
	}
}

// testAging holds a low-priority request under sustained high-priority
// load to the documented bound, with an aging period of 1 s (see
// AgingWait).
func testAging(t *testing.T, b reserve.Backend) {
	const period = time.Second
	wait, bound := AgingWait(t, b, period)
	t.Logf("a low-priority request under high-priority load waited %s (aging period %s, bound %s)", wait, period, bound)
	if wait > bound {
		t.Errorf("the low request waited %s, above the bound %s", wait, bound)
	}
	// Passed over by h's requests until it is overdue: the load held it
	// back as long as the aging lets it, else the run shows nothing.
	if wait < 3*period {
		t.Errorf("the low request waited %s, less than 3 aging periods: the load did not hold it back", wait)
	}
}

func testGrantQueueUseRelease(t *testing.T, b reserve.Backend) {
	c := NewClock()
	k, sink := NewKeeper(t, b, c.Now, 10)
	a, err := k.Reserve(Ask("a", 60, time.Minute))
	if err != nil || !a.Granted || a.Position != 0 || !a.ExpiresAt.Equal(c.Now().Add(time.Minute)) {
		t.Fatalf("Reserve a = %+v, %v; want granted until %v", a, err, c.Now().Add(time.Minute))
	}
	c.Add(time.Second)
	q, err := k.Reserve(Ask("b", 50, time.Minute))
	if err != nil || q.Granted || q.Position != 1 || !q.EstimatedAt.Equal(a.ExpiresAt) {
		t.Fatalf("Reserve b = %+v, %v; want queued at 1, estimated %v", q, err, a.ExpiresAt)
	}
	if st, err := k.Get("b", q.ID); err != nil || st.State != "queued" || st.Position != 1 {
		t.Errorf("Get b = %+v, %v; want queued at 1", st, err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "b"}, q.ID, 1); !errors.Is(err, reservation.ErrNotGranted) {
		t.Errorf("Use of a queued request: %v, want ErrNotGranted", err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "b"}, a.ID, 1); !errors.Is(err, reserve.ErrForbidden) {
		t.Errorf("Use of another's reservation: %v, want ErrForbidden", err)
	}
	st, err := k.Use(&policy.Request{ClientID: "a"}, a.ID, 10)
	if err != nil || st.Balance != 50 || st.Used != 10 || st.Tokens != 60 || st.Rule != "api" {
		t.Fatalf("Use 10 = %+v, %v; want balance 50, used 10", st, err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "a"}, a.ID, 51); !errors.Is(err, reservation.ErrInsufficient) {
		t.Errorf("Use 51 of 50: %v, want ErrInsufficient", err)
	}
	if held, capacity := k.Held("a", "/api/orders"); held != 60 || capacity != 100 {
		t.Errorf("Held = %d of %d, want 60 of 100", held, capacity)
	}
	end, err := k.Release("a", a.ID)
	if err != nil || end.State != "released" || end.Returned != 50 {
		t.Fatalf("Release a = %+v, %v; want released, 50 returned", end, err)
	}
	// b is granted from the queue by the release.
	if st, err := k.Get("b", q.ID); err != nil || st.State != "granted" || st.Balance != 50 {
		t.Errorf("Get b after the release = %+v, %v; want granted", st, err)
	}
	if held, _ := k.Held("a", "/api/orders"); held != 60 {
		t.Errorf("Held after the release = %d, want 60 (10 used, 50 granted to b)", held)
	}
	if _, err := k.Release("a", a.ID); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("second Release: %v, want ErrNotFound", err)
	}
	if _, err := k.Get("a", a.ID); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("Get of a released reservation: %v, want ErrNotFound", err)
	}
	if held, _ := k.Held("a", "/api/orders"); held != 60 {
		t.Errorf("Held after a second release = %d, want 60", held)
	}
	if n, tokens := sink.Tokens(events.ReservationReleased); n != 1 || tokens != 50 {
		t.Errorf("released events: %d of %d tokens, want 1 of 50", n, tokens)
	}
	if n, tokens := sink.Tokens(events.ReservationGranted); n != 2 || tokens != 110 {
		t.Errorf("granted events: %d of %d tokens, want 2 of 110", n, tokens)
	}
}

func testExpiry(t *testing.T, b reserve.Backend) {
	c := NewClock()
	k, sink := NewKeeper(t, b, c.Now, 10)
	a, err := k.Reserve(Ask("a", 40, 10*time.Second))
	if err != nil || !a.Granted {
		t.Fatalf("Reserve a = %+v, %v", a, err)
	}
	x, err := k.Reserve(Ask("x", 30, 20*time.Second))
	if err != nil || !x.Granted {
		t.Fatalf("Reserve x = %+v, %v", x, err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "a"}, a.ID, 15); err != nil {
		t.Fatal(err)
	}
	c.Add(10 * time.Second) // a expires now: 25 unused and 15 used go back
	k.Sweep()
	k.Sweep()
	if n, tokens := sink.Tokens(events.ReservationExpired); n != 1 || tokens != 40 {
		t.Errorf("after a's expiry: %d expired events of %d tokens, want 1 of 40", n, tokens)
	}
	if held, _ := k.Held("a", "/api/orders"); held != 30 {
		t.Errorf("Held after a's expiry = %d, want 30", held)
	}
	if _, err := k.Use(&policy.Request{ClientID: "a"}, a.ID, 1); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("Use after expiry: %v, want ErrNotFound", err)
	}
	if _, err := k.Release("a", a.ID); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("Release after expiry: %v, want ErrNotFound", err)
	}
	// x is released, then expires: its balance returned once, at the
	// release, and nothing at the expiry.
	if end, err := k.Release("x", x.ID); err != nil || end.Returned != 30 {
		t.Fatalf("Release x = %+v, %v; want 30 returned", end, err)
	}
	c.Add(10 * time.Second)
	if _, err := k.Get("x", x.ID); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("Get after expiry: %v, want ErrNotFound", err)
	}
	k.Sweep()
	if n, tokens := sink.Tokens(events.ReservationExpired); n != 2 || tokens != 40 {
		t.Errorf("after x's expiry: %d expired events of %d tokens, want 2 of 40", n, tokens)
	}
	if held, _ := k.Held("a", "/api/orders"); held != 0 {
		t.Errorf("Held at the end = %d, want 0", held)
	}
}

func testCancelQueueFull(t *testing.T, b reserve.Backend) {
	c := NewClock()
	k, _ := NewKeeper(t, b, c.Now, 2)
	a, err := k.Reserve(Ask("a", 100, time.Minute))
	if err != nil || !a.Granted {
		t.Fatalf("Reserve a = %+v, %v", a, err)
	}
	var queued []reserve.Result
	for _, client := range []string{"b", "c"} {
		r, err := k.Reserve(Ask(client, 10, time.Minute))
		if err != nil || r.Granted {
			t.Fatalf("Reserve %s = %+v, %v; want queued", client, r, err)
		}
		queued = append(queued, r)
	}
	if _, err := k.Reserve(Ask("d", 10, time.Minute)); !errors.Is(err, reservation.ErrQueueFull) {
		t.Fatalf("Reserve with a full queue: %v, want ErrQueueFull", err)
	}
	if _, err := k.Release("c", queued[0].ID); !errors.Is(err, reserve.ErrForbidden) {
		t.Errorf("cancel by another client: %v, want ErrForbidden", err)
	}
	end, err := k.Release("b", queued[0].ID)
	if err != nil || end.State != "cancelled" || end.Returned != 0 {
		t.Fatalf("cancel b = %+v, %v; want cancelled", end, err)
	}
	if _, err := k.Get("b", queued[0].ID); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("Get of a cancelled request: %v, want ErrNotFound", err)
	}
	if st, err := k.Get("c", queued[1].ID); err != nil || st.Position != 1 {
		t.Errorf("Get c = %+v, %v; want position 1", st, err)
	}
	if pos, _, ok := k.Queued("c", "/api/orders"); !ok || pos != 1 {
		t.Errorf("Queued c = %d, %v; want 1", pos, ok)
	}
	r, err := k.Reserve(Ask("d", 10, time.Minute))
	if err != nil || r.Position != 2 {
		t.Errorf("Reserve after the cancellation = %+v, %v; want queued at 2", r, err)
	}
	if held, _ := k.Held("a", "/api/orders"); held != 100 {
		t.Errorf("Held = %d, want 100", held)
	}
}

func testInvalid(t *testing.T, b reserve.Backend) {
	k, _ := NewKeeper(t, b, NewClock().Now, 10)
	for _, tt := range []struct {
		a     reserve.Ask
		field string
	}{
		{Ask("a", 0, time.Minute), "tokens"},
		{Ask("a", 101, time.Minute), "tokens"},
		{Ask("a", 1, 301*time.Second), "duration"},
		{reserve.Ask{Client: "a", Resource: "/api/x", Tokens: 1, Duration: time.Minute, Priority: 9}, "priority"},
		{reserve.Ask{Client: "a", Resource: "/other", Tokens: 1, Duration: time.Minute, Priority: 1}, "resource"},
	} {
		_, err := k.Reserve(tt.a)
		var ie *reservation.InvalidError
		if !errors.As(err, &ie) || ie.Field != tt.field {
			t.Errorf("Reserve(%+v): %v, want invalid %s", tt.a, err, tt.field)
		}
	}
	if _, err := k.Get("a", "rsv_0123456789abcdef_0123456789abcdef0123456789abcdef"); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("Get of an unknown ID: %v, want ErrNotFound", err)
	}
}
