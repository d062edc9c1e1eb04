package reserve

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/reservation"
)

// collect is a Sink that keeps what it receives.
type collect struct {
	mu  sync.Mutex
	evs []events.Event
}

func (c *collect) Emit(ev *events.Event) {
	c.mu.Lock()
	c.evs = append(c.evs, *ev)
	c.mu.Unlock()
}

func (c *collect) tokens(t events.Type) (n int, tokens int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range c.evs {
		if ev.Type == t {
			n++
			tokens += ev.Tokens
		}
	}
	return n, tokens
}

const testPolicy = `version: 1
rules:
  - {id: api, match: {resource: "/api/*"}, limit: 100, window: 1m, algorithm: fixed_window}
`

// clock is a settable clock.
type clock struct{ us atomic.Int64 }

func (c *clock) now() time.Time            { return time.UnixMicro(c.us.Load()) }
func (c *clock) add(d time.Duration)       { c.us.Add(d.Microseconds()) }
func newClock() *clock                     { c := &clock{}; c.us.Store(1_800_000_000_000_000); return c }
func (c *collect) count(t events.Type) int { n, _ := c.tokens(t); return n }

func newKeeper(t *testing.T, now func() time.Time, queue int64) (*Keeper, *collect) {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	sink := &collect{}
	k, err := New(Config{Policy: func() *policy.Policy { return p }, Now: now, QueueLimit: queue,
		SweepEvery: -1, Events: events.New(events.Config{Sinks: []events.Sink{sink}})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k, sink
}

func ask(client string, tokens int64, d time.Duration) Ask {
	return Ask{Client: client, Resource: "/api/orders", Tokens: tokens, Duration: d, Priority: reservation.Normal}
}

func TestGrantUseReleaseQueue(t *testing.T) {
	c := newClock()
	k, sink := newKeeper(t, c.now, 2)
	a, err := k.Reserve(ask("a", 60, time.Minute))
	if err != nil || !a.Granted || a.Position != 0 {
		t.Fatalf("Reserve a = %+v, %v; want granted", a, err)
	}
	if want := c.now().Add(time.Minute); !a.ExpiresAt.Equal(want) {
		t.Errorf("ExpiresAt = %v, want %v", a.ExpiresAt, want)
	}
	b, err := k.Reserve(ask("b", 50, time.Minute))
	if err != nil || b.Granted || b.Position != 1 || b.EstimatedAt.IsZero() {
		t.Fatalf("Reserve b = %+v, %v; want queued at 1", b, err)
	}
	if st, err := k.Use(&policy.Request{ClientID: "a"}, a.ID, 10); err != nil || st.Balance != 50 || st.Used != 10 {
		t.Fatalf("Use = %+v, %v; want balance 50, used 10", st, err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "a"}, a.ID, 51); !errors.Is(err, reservation.ErrInsufficient) {
		t.Errorf("Use above the balance: %v, want ErrInsufficient", err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "b"}, b.ID, 1); !errors.Is(err, reservation.ErrNotGranted) {
		t.Errorf("Use of a queued one: %v, want ErrNotGranted", err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "b"}, a.ID, 1); !errors.Is(err, ErrForbidden) {
		t.Errorf("Use by another client: %v, want ErrForbidden", err)
	}
	st, err := k.Get("", b.ID)
	if err != nil || st.State != "queued" || st.Position != 1 || !st.EstimatedAt.Equal(a.ExpiresAt) {
		t.Errorf("Get b = %+v, %v; want queued at 1, granted by %v", st, err, a.ExpiresAt)
	}
	end, err := k.Release("a", a.ID)
	if err != nil || end.State != "released" || end.Returned != 50 {
		t.Fatalf("Release = %+v, %v; want released 50", end, err)
	}
	if _, err := k.Release("a", a.ID); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("second Release: %v, want ErrNotFound", err)
	}
	// 10 used stay held until a expires; 50 free let b in.
	if st, err := k.Get("b", b.ID); err != nil || st.State != "granted" || st.Balance != 50 {
		t.Errorf("Get b after release = %+v, %v; want granted, balance 50", st, err)
	}
	if held, _ := k.Held("a", "/api/orders"); held != 60 {
		t.Errorf("held = %d, want 60", held)
	}
	c.add(time.Minute)
	k.Sweep()
	if held, _ := k.Held("a", "/api/orders"); held != 0 {
		t.Errorf("held after expiry = %d, want 0", held)
	}
	if n, tok := sink.tokens(events.ReservationExpired); n != 2 || tok != 60 {
		t.Errorf("expired events %d returning %d, want 2 returning 60 (10 used by a, 50 of b)", n, tok)
	}
	if n, tok := sink.tokens(events.ReservationReleased); n != 1 || tok != 50 {
		t.Errorf("released events %d returning %d, want 1 returning 50", n, tok)
	}
	if n := sink.count(events.ReservationGranted); n != 2 {
		t.Errorf("granted events %d, want 2", n)
	}
	if _, err := k.Get("", b.ID); !errors.Is(err, reservation.ErrNotFound) {
		t.Errorf("Get after expiry: %v, want ErrNotFound", err)
	}
}

func TestCancelAndQueueFull(t *testing.T) {
	c := newClock()
	k, _ := newKeeper(t, c.now, 2)
	if _, err := k.Reserve(ask("a", 100, time.Minute)); err != nil {
		t.Fatal(err)
	}
	q1, err := k.Reserve(ask("b", 1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Reserve(ask("c", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Reserve(ask("d", 1, time.Minute)); !errors.Is(err, reservation.ErrQueueFull) {
		t.Fatalf("third queued: %v, want ErrQueueFull", err)
	}
	if _, err := k.Release("c", q1.ID); !errors.Is(err, ErrForbidden) {
		t.Errorf("cancel by another client: %v, want ErrForbidden", err)
	}
	end, err := k.Release("b", q1.ID)
	if err != nil || end.State != "cancelled" || end.Returned != 0 {
		t.Fatalf("cancel = %+v, %v", end, err)
	}
	if _, err := k.Reserve(ask("d", 1, time.Minute)); err != nil {
		t.Errorf("after a cancel: %v, want queued", err)
	}
}

func TestInvalid(t *testing.T) {
	c := newClock()
	k, _ := newKeeper(t, c.now, 2)
	for _, tc := range []struct {
		a     Ask
		field string
	}{
		{ask("a", 0, time.Minute), "tokens"},
		{ask("a", 101, time.Minute), "tokens"},
		{ask("a", 1, 0), "duration"},
		{ask("a", 1, 301*time.Second), "duration"},
		{Ask{Client: "a", Resource: "/api/x", Tokens: 1, Duration: time.Second}, "priority"},
		{Ask{Client: "a", Resource: "/other", Tokens: 1, Duration: time.Second, Priority: reservation.Low}, "resource"},
		{Ask{Resource: "/api/x", Tokens: 1, Duration: time.Second, Priority: reservation.Low}, "client"},
	} {
		_, err := k.Reserve(tc.a)
		var ie *reservation.InvalidError
		if !errors.As(err, &ie) || ie.Field != tc.field {
			t.Errorf("Reserve(%+v) = %v, want invalid %s", tc.a, err, tc.field)
		}
	}
	for _, id := range []string{"", "rsv_x", "rsv_0123456789abcdef_0123456789abcdef0123456789abcdef"} {
		if _, err := k.Get("", id); !errors.Is(err, reservation.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrNotFound", id, err)
		}
	}
}

// TestSweepExpires runs the Keeper's own sweep on synctest's clock: an
// unused reservation returns its tokens by itself, once.
func TestSweepExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := policy.Parse("test.yaml", []byte(testPolicy))
		if err != nil {
			t.Fatal(err)
		}
		sink := &collect{}
		k, err := New(Config{Policy: func() *policy.Policy { return p },
			Events: events.New(events.Config{Sinks: []events.Sink{sink}})})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		r, err := k.Reserve(ask("a", 40, 10*time.Second))
		if err != nil || !r.Granted {
			t.Fatalf("Reserve = %+v, %v", r, err)
		}
		time.Sleep(12 * time.Second)
		synctest.Wait()
		if n, tok := sink.tokens(events.ReservationExpired); n != 1 || tok != 40 {
			t.Errorf("expired events %d returning %d, want 1 returning 40", n, tok)
		}
		if held, capacity := k.Held("a", "/api/orders"); held != 0 || capacity != 0 {
			t.Errorf("held %d of %d, want the idle pool forgotten", held, capacity)
		}
	})
}

// TestConcurrent reserves 1,000 times at once against a capacity of 100:
// never more than 100 held, and every token back after release or expiry.
func TestConcurrent(t *testing.T) {
	c := newClock()
	k, sink := newKeeper(t, c.now, reservation.MaxQueueLimit)
	var wg sync.WaitGroup
	var over atomic.Int64
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := string(rune('a' + i%20))
			r, err := k.Reserve(ask(client, int64(1+i%7), time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			if held, capacity := k.Held(client, "/api/orders"); held > capacity {
				over.Add(1)
			}
			if r.Granted {
				k.Use(&policy.Request{ClientID: client}, r.ID, 1)
			}
			if i%2 == 0 {
				k.Release(client, r.ID)
			}
		}()
	}
	wg.Wait()
	if over.Load() != 0 {
		t.Errorf("%d times more than the capacity held", over.Load())
	}
	// Let everything granted expire, and the queue drain through it.
	for range 1000 {
		c.add(time.Minute)
		k.Sweep()
		if held, _ := k.Held("a", "/api/orders"); held == 0 {
			break
		}
	}
	if held, _ := k.Held("a", "/api/orders"); held != 0 {
		t.Errorf("held at the end = %d, want 0", held)
	}
	ng, granted := sink.tokens(events.ReservationGranted)
	_, released := sink.tokens(events.ReservationReleased)
	_, expired := sink.tokens(events.ReservationExpired)
	if released+expired != granted {
		t.Errorf("%d grants of %d tokens; returned %d released + %d expired", ng, granted, released, expired)
	}
}

func TestMaxPools(t *testing.T) {
	c := newClock()
	p, err := policy.Parse("test.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	k, err := New(Config{Policy: func() *policy.Policy { return p }, Now: c.now, SweepEvery: -1, MaxPools: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for i, res := range []string{"/api/a", "/api/b", "/api/c"} {
		_, err := k.Reserve(Ask{Client: "a", Resource: res, Tokens: 1, Duration: time.Second, Priority: reservation.Low})
		if wantFull := i == 2; errors.Is(err, reservation.ErrQueueFull) != wantFull {
			t.Errorf("pool %d: %v, want full %v", i+1, err, wantFull)
		}
	}
	c.add(time.Second)
	k.Sweep()
	if _, err := k.Reserve(Ask{Client: "a", Resource: "/api/c", Tokens: 1, Duration: time.Second, Priority: reservation.Low}); err != nil {
		t.Errorf("after the sweep: %v", err)
	}
}

// TestDenyListed: a deny-listed caller can neither reserve nor draw, by
// any of its identities.
func TestDenyListed(t *testing.T) {
	c := newClock()
	p, err := policy.Parse("test.yaml", []byte(testPolicy+"deny:\n  - client: bad\n  - ip: 203.0.113.66\n"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := New(Config{Policy: func() *policy.Policy { return p }, Now: c.now, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if _, err := k.Reserve(ask("bad", 1, time.Second)); !errors.Is(err, ErrDenyListed) {
		t.Errorf("Reserve by a deny-listed client: %v, want ErrDenyListed", err)
	}
	r, err := k.Reserve(ask("a", 1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Use(&policy.Request{ClientID: "a", IP: "203.0.113.66", Resource: "/api/orders"}, r.ID, 1); !errors.Is(err, ErrDenyListed) {
		t.Errorf("Use from a deny-listed IP: %v, want ErrDenyListed", err)
	}
}

// A rule with only a global limit makes no pool: the next rule with a
// limit of its own does, and a resource only such a rule matches cannot
// be reserved.
func TestGlobalOnlyRuleMakesNoPool(t *testing.T) {
	p, err := policy.Parse("test.yaml", []byte(`version: 1
rules:
  - {id: g, match: {resource: "/*"}, window: 1m, global_limit: 1000}
  - {id: api, match: {resource: "/api/*"}, limit: 100, window: 1m, algorithm: fixed_window}
`))
	if err != nil {
		t.Fatal(err)
	}
	k, err := New(Config{Policy: func() *policy.Policy { return p }, Now: newClock().now, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if rule, capacity := k.match("a", "/api/orders"); rule == nil || rule.ID != "api" || capacity != 100 {
		t.Errorf("/api/orders: pool of %v with %d, want api's, 100", rule, capacity)
	}
	if rule, _ := k.match("a", "/other"); rule != nil {
		t.Errorf("/other: pool of %q, want none", rule.ID)
	}
}
