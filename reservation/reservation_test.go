package reservation

import (
	"errors"
	"testing"
)

const (
	t0  = int64(1_767_225_600_000_000) // 2026-01-01T00:00:00Z, in µs
	sec = int64(1_000_000)
)

func testConfig() *Config {
	return &Config{
		Capacity:    10,
		QueueLimit:  3,
		AgingPeriod: 10 * sec,
		MaxDuration: 60 * sec,
		Quotas: map[string]Quota{
			"small": {Weight: 1, MaxBurst: 4},
			"vip":   {Weight: 2, MinGuaranteed: 5},
		},
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(c *Config)
		field string
	}{
		{"valid", func(c *Config) {}, ""},
		{"capacity 0", func(c *Config) { c.Capacity = 0 }, "capacity"},
		{"capacity too large", func(c *Config) { c.Capacity = MaxCapacity + 1 }, "capacity"},
		{"queue 0", func(c *Config) { c.QueueLimit = 0 }, "queue_limit"},
		{"aging 0", func(c *Config) { c.AgingPeriod = 0 }, "aging_period"},
		{"queue of too many tokens", func(c *Config) { c.Capacity, c.QueueLimit = MaxCapacity, 1<<7 }, "queue_limit"},
		{"duration above 300s", func(c *Config) { c.MaxDuration = MaxDuration + 1 }, "max_duration"},
		{"weight too large", func(c *Config) { c.Quotas["x"] = Quota{Weight: MaxWeight + 1} }, "fairness_quotas"},
		{"burst above capacity", func(c *Config) { c.Default.MaxBurst = 11 }, "fairness_quotas"},
		{"guarantee above burst", func(c *Config) { c.Quotas["x"] = Quota{MinGuaranteed: 3, MaxBurst: 2} }, "fairness_quotas"},
		{"guarantees above capacity", func(c *Config) { c.Quotas["x"] = Quota{MinGuaranteed: 6} }, "fairness_quotas"},
	} {
		c := testConfig()
		tc.edit(c)
		err := c.Validate()
		var ie *InvalidError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: got %v, want nil", tc.name, err)
		case tc.field != "" && (!errors.As(err, &ie) || ie.Field != tc.field || !errors.Is(err, ErrInvalid)):
			t.Errorf("%s: got %v, want an invalid %s", tc.name, err, tc.field)
		}
	}
}

func TestReserveInvalid(t *testing.T) {
	c := testConfig()
	for _, tc := range []struct {
		name     string
		client   string
		tokens   int64
		duration int64
		p        Priority
		field    string
	}{
		{"no client", "", 1, sec, Normal, "client"},
		{"zero tokens", "a", 0, sec, Normal, "tokens"},
		{"negative tokens", "a", -1, sec, Normal, "tokens"},
		{"above capacity", "a", 11, sec, Normal, "tokens"},
		{"above the client's burst", "small", 5, sec, Normal, "tokens"},
		{"zero duration", "a", 1, 0, Normal, "duration"},
		{"negative duration", "a", 1, -sec, Normal, "duration"},
		{"above the pool's max duration", "a", 1, 60*sec + 1, Normal, "duration"},
		{"unknown priority", "a", 1, sec, Priority(4), "priority"},
		{"no priority", "a", 1, sec, 0, "priority"},
		{"negative priority", "a", 1, sec, Priority(-1), "priority"},
	} {
		var s State
		_, _, err := Reserve(c, &s, t0, Ask{Client: tc.client, Tokens: tc.tokens, Duration: tc.duration, Priority: tc.p})
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Field != tc.field {
			t.Errorf("%s: got %v, want an invalid %s", tc.name, err, tc.field)
		}
		if s.Held != 0 || len(s.Queue) != 0 || s.LastID != 0 {
			t.Errorf("%s: state changed: %+v", tc.name, s)
		}
	}
	// 300 s is the ceiling whatever the pool says.
	c.MaxDuration = 0
	var s State
	if _, _, err := Reserve(c, &s, t0, Ask{Client: "a", Tokens: 1, Duration: MaxDuration + 1, Priority: Normal}); err == nil {
		t.Errorf("duration above 300s: got nil error")
	}
	if r, _, err := Reserve(c, &s, t0, Ask{Client: "a", Tokens: 1, Duration: MaxDuration, Priority: Normal}); err != nil || !r.Granted {
		t.Errorf("duration 300s: got %+v, %v, want granted", r, err)
	}
}

// op is one step of a table test: a transition and what it must return.
type op struct {
	at      int64  // seconds after t0
	do      string // reserve, use, complete, release, cancel, expire
	client  string
	n       int64    // tokens, or the ID for use/complete/release/cancel
	m       int64    // duration in seconds for reserve, tokens for use/complete
	p       Priority // Normal if zero
	err     error
	want    Result  // for reserve (EstimatedAt in seconds after t0)
	ret     int64   // tokens returned, for release
	granted []int64 // IDs granted by the transition's effects
	expired []int64 // IDs expired by the transition
	held    int64   // s.Held after
}

func runOps(t *testing.T, c *Config, ops []op) *State {
	t.Helper()
	var s State
	for i, o := range ops {
		now := t0 + o.at*sec
		var fx Effects
		var err error
		switch o.do {
		case "reserve":
			if o.p == 0 {
				o.p = Normal
			}
			var r Result
			r, fx, err = Reserve(c, &s, now, Ask{Client: o.client, Tokens: o.n, Duration: o.m * sec, Priority: o.p})
			if err == nil {
				w := o.want
				if w.Granted {
					w.ExpiresAt = t0 + w.ExpiresAt*sec
				} else {
					w.EstimatedAt = t0 + w.EstimatedAt*sec
				}
				if r != w {
					t.Errorf("op %d: reserve got %+v, want %+v", i, r, w)
				}
			}
		case "use":
			_, fx, err = Use(c, &s, now, o.n, o.m)
		case "complete":
			_, fx, err = Complete(c, &s, now, o.n, o.m)
		case "release":
			var ret int64
			ret, fx, err = Release(c, &s, now, o.n)
			if ret != o.ret {
				t.Errorf("op %d: release returned %d, want %d", i, ret, o.ret)
			}
		case "cancel":
			fx, err = Cancel(c, &s, now, o.n)
		case "expire":
			fx = Expire(c, &s, now)
		}
		if !errors.Is(err, o.err) {
			t.Errorf("op %d (%s): got error %v, want %v", i, o.do, err, o.err)
		}
		var g, e []int64
		for _, x := range fx.Granted {
			g = append(g, x.ID)
		}
		for _, x := range fx.Expired {
			e = append(e, x.ID)
		}
		if !equal(g, o.granted) || !equal(e, o.expired) {
			t.Errorf("op %d (%s): granted %v expired %v, want %v and %v", i, o.do, g, e, o.granted, o.expired)
		}
		if s.Held != o.held {
			t.Errorf("op %d (%s): held %d, want %d", i, o.do, s.Held, o.held)
		}
		checkInvariant(t, c, &s)
	}
	return &s
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkInvariant checks that the pool's and the clients' holdings are the
// sums of the reservations', within the capacity.
func checkInvariant(t *testing.T, c *Config, s *State) {
	t.Helper()
	sum := int64(0)
	per := map[string]int64{}
	for _, r := range s.Granted {
		if r.Balance < 0 || r.InUse < 0 || r.Balance+r.InUse > r.Tokens {
			t.Fatalf("reservation %+v out of range", r)
		}
		sum += r.Balance + r.InUse
		per[r.Client] += r.Balance + r.InUse
	}
	if s.Held != sum || s.Held > c.Capacity || s.Held < 0 {
		t.Fatalf("held %d, reservations hold %d, capacity %d", s.Held, sum, c.Capacity)
	}
	for name, cl := range s.Clients {
		if cl.Held != per[name] {
			t.Fatalf("client %s holds %d, its reservations %d", name, cl.Held, per[name])
		}
	}
	for name, n := range per {
		if n > 0 && s.Clients[name].Held != n {
			t.Fatalf("client %s missing, its reservations hold %d", name, n)
		}
	}
}

func TestLifecycle(t *testing.T) {
	runOps(t, testConfig(), []op{
		{at: 0, do: "reserve", client: "a", n: 6, m: 30, want: Result{ID: 1, Granted: true, ExpiresAt: 30}, granted: []int64{1}, held: 6},
		{at: 1, do: "use", n: 1, m: 2, held: 6},
		{at: 1, do: "use", n: 1, m: 5, err: ErrInsufficient, held: 6}, // 4 left
		{at: 1, do: "use", n: 1, m: 0, err: ErrInvalid, held: 6},
		{at: 2, do: "complete", n: 1, m: 1, held: 5}, // a use done: one token back
		{at: 2, do: "complete", n: 1, m: 2, err: ErrInsufficient, held: 5},
		{at: 3, do: "release", n: 1, ret: 4, held: 1},                 // the balance back, 1 still in use
		{at: 3, do: "release", n: 1, ret: 0, held: 1},                 // twice: once
		{at: 3, do: "use", n: 1, m: 1, err: ErrInsufficient, held: 1}, // nothing left to use
		{at: 30, do: "expire", expired: []int64{1}, held: 0},          // the last token in use back
		{at: 31, do: "release", n: 1, err: ErrNotFound, held: 0},
		{at: 31, do: "use", n: 1, m: 1, err: ErrNotFound, held: 0},
		{at: 31, do: "complete", n: 1, m: 1, err: ErrNotFound, held: 0},
		{at: 31, do: "cancel", n: 1, err: ErrNotFound, held: 0},
		{at: 31, do: "release", n: 99, err: ErrNotFound, held: 0},
	})
}

func TestQueueAndGrant(t *testing.T) {
	runOps(t, testConfig(), []op{
		{at: 0, do: "reserve", client: "a", n: 8, m: 20, p: Normal, want: Result{ID: 1, Granted: true, ExpiresAt: 20}, granted: []int64{1}, held: 8},
		// 2 free: 3 queued, estimated when the 8 expire.
		{at: 0, do: "reserve", client: "b", n: 3, m: 10, p: Normal, want: Result{ID: 2, Position: 1, EstimatedAt: 20}, held: 8},
		// 2 would fit but b's request is ahead of it: queued behind.
		{at: 0, do: "reserve", client: "b", n: 2, m: 10, p: Normal, want: Result{ID: 3, Position: 2, EstimatedAt: 20}, held: 8},
		{at: 0, do: "reserve", client: "b", n: 1, m: 10, p: Normal, want: Result{ID: 4, Position: 3, EstimatedAt: 20}, held: 8},
		{at: 0, do: "reserve", client: "d", n: 1, m: 10, p: Normal, err: ErrQueueFull, held: 8},
		{at: 0, do: "use", n: 2, m: 1, err: ErrNotGranted, held: 8},
		{at: 0, do: "release", n: 2, err: ErrNotGranted, held: 8},
		{at: 0, do: "cancel", n: 1, err: ErrNotQueued, held: 8},
		// The release brings 8 back: the queue is granted in order.
		{at: 1, do: "release", n: 1, ret: 8, granted: []int64{2, 3, 4}, held: 6},
		{at: 2, do: "cancel", n: 2, err: ErrNotQueued, held: 6},
	})
}

func TestCancelUnblocks(t *testing.T) {
	runOps(t, testConfig(), []op{
		{at: 0, do: "reserve", client: "a", n: 8, m: 20, want: Result{ID: 1, Granted: true, ExpiresAt: 20}, granted: []int64{1}, held: 8},
		{at: 0, do: "reserve", client: "b", n: 5, m: 10, want: Result{ID: 2, Position: 1, EstimatedAt: 20}, held: 8},
		{at: 0, do: "reserve", client: "b", n: 2, m: 10, want: Result{ID: 3, Position: 2, EstimatedAt: 20}, held: 8},
		// The head that did not fit goes: the 2 behind it fit.
		{at: 1, do: "cancel", n: 2, granted: []int64{3}, held: 10},
		{at: 1, do: "cancel", n: 2, err: ErrNotFound, held: 10},
		{at: 2, do: "release", n: 3, ret: 2, held: 8},
		{at: 2, do: "reserve", client: "b", n: 2, m: 10, want: Result{ID: 4, Granted: true, ExpiresAt: 12}, granted: []int64{4}, held: 10},
		{at: 2, do: "reserve", client: "b", n: 2, m: 10, want: Result{ID: 5, Position: 1, EstimatedAt: 12}, held: 10},
		// c has had nothing: its finish tag is earlier than that of b's
		// queued request, so it goes ahead of it.
		{at: 3, do: "reserve", client: "c", n: 2, m: 10, want: Result{ID: 6, Position: 1, EstimatedAt: 12}, held: 10},
		{at: 4, do: "release", n: 4, ret: 2, granted: []int64{6}, held: 10},
	})
}

func TestExpiryGrants(t *testing.T) {
	runOps(t, testConfig(), []op{
		{at: 0, do: "reserve", client: "a", n: 10, m: 5, want: Result{ID: 1, Granted: true, ExpiresAt: 5}, granted: []int64{1}, held: 10},
		{at: 1, do: "reserve", client: "b", n: 4, m: 10, want: Result{ID: 2, Position: 1, EstimatedAt: 5}, held: 10},
		{at: 1, do: "use", n: 1, m: 7, held: 10},
		{at: 4, do: "expire", held: 10},
		// Expiry returns balance and tokens in use, and grants.
		{at: 5, do: "expire", expired: []int64{1}, granted: []int64{2}, held: 4},
		// A transition expires what is due before its own work.
		{at: 15, do: "reserve", client: "c", n: 10, m: 1, want: Result{ID: 3, Granted: true, ExpiresAt: 16}, expired: []int64{2}, granted: []int64{3}, held: 10},
	})
}

func TestPriorityAndAging(t *testing.T) {
	c := testConfig()
	c.QueueLimit = 10
	runOps(t, c, []op{
		{at: 0, do: "reserve", client: "a", n: 10, m: 60, want: Result{ID: 1, Granted: true, ExpiresAt: 60}, granted: []int64{1}, held: 10},
		{at: 0, do: "reserve", client: "low", n: 5, m: 10, p: Low, want: Result{ID: 2, Position: 1, EstimatedAt: 60}, held: 10},
		// High goes ahead of low.
		{at: 1, do: "reserve", client: "hi", n: 5, m: 10, p: High, want: Result{ID: 3, Position: 1, EstimatedAt: 60}, held: 10},
		// At 25 the low request has aged to high, and the first high one
		// is overdue.
		{at: 25, do: "reserve", client: "hi", n: 5, m: 10, p: High, want: Result{ID: 4, Position: 3, EstimatedAt: 70}, held: 10},
		// At 32 the low request is overdue too: it goes before the high
		// request of 25, which without aging would have been ahead.
		{at: 32, do: "release", n: 1, ret: 10, granted: []int64{3, 2}, held: 10},
	})
}

func TestGuaranteeAndBurst(t *testing.T) {
	c := testConfig()
	c.QueueLimit = 10
	runOps(t, c, []op{
		{at: 0, do: "reserve", client: "a", n: 10, m: 60, want: Result{ID: 1, Granted: true, ExpiresAt: 60}, granted: []int64{1}, held: 10},
		{at: 0, do: "reserve", client: "b", n: 5, m: 10, p: High, want: Result{ID: 2, Position: 1, EstimatedAt: 60}, held: 10},
		// vip is within its guarantee of 5: ahead even of high.
		{at: 0, do: "reserve", client: "vip", n: 5, m: 10, p: Low, want: Result{ID: 3, Position: 1, EstimatedAt: 60}, held: 10},
		{at: 0, do: "reserve", client: "small", n: 4, m: 10, p: High, want: Result{ID: 4, Position: 2, EstimatedAt: 60}, held: 10},
		{at: 0, do: "reserve", client: "small", n: 1, m: 10, p: High, want: Result{ID: 5, Position: 4, EstimatedAt: 70}, held: 10},
		// 10 back: vip 5, then small 4 (b's 5 does not fit and blocks the rest).
		{at: 1, do: "release", n: 1, ret: 10, granted: []int64{3, 4}, held: 9},
		// 5 back: b's 5 fit; small's 1 would too but small is at its burst.
		{at: 2, do: "release", n: 3, ret: 5, granted: []int64{2}, held: 9},
		{at: 3, do: "release", n: 4, ret: 4, granted: []int64{5}, held: 6},
	})
}

// TestRebase checks that the tags are shifted down once the virtual time
// passes its bound, keeping the differences between clients.
func TestRebase(t *testing.T) {
	c := testConfig()
	v0 := int64(rebaseAt - 1)
	// A released record keeps the pool from being idle (and reset).
	s := State{Virtual: v0, LastID: 1, Granted: []Reservation{{ID: 1, Client: "z", Tokens: 1, ExpiresAt: t0 + 60*sec, Released: true}},
		Clients: map[string]Client{"z": {}}}
	do := func(client string, n int64) Result {
		t.Helper()
		r, _, err := Reserve(c, &s, t0, Ask{Client: client, Tokens: n, Duration: sec, Priority: Normal})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := do("a", 10) // granted at v0, a's finish v0 + 10 units
	do("b", 5)           // queued: start v0, finish v0 + 5 units
	do("a", 5)           // queued: start v0 + 10 units
	if s.Virtual != v0 {
		t.Fatalf("virtual %d, want %d", s.Virtual, v0)
	}
	if _, fx, err := Release(c, &s, t0, first.ID); err != nil || len(fx.Granted) != 2 {
		t.Fatalf("release: %+v, %v, want two grants", fx, err)
	}
	// Granting a's second request moved V to v0 + 10 units, past the bound:
	// everything is shifted down by it.
	const u = VirtualScale
	if s.Virtual != 0 || s.Clients["a"].Finish != 5*u || s.Clients["b"].Finish != -5*u {
		t.Fatalf("after the rebase: virtual %d, finish a %d b %d, want 0, %d, %d",
			s.Virtual, s.Clients["a"].Finish, s.Clients["b"].Finish, 5*u, -5*u)
	}
}

// TestIdleResets checks that a pool with nothing held, granted or queued
// is the zero State again.
func TestIdleResets(t *testing.T) {
	c := testConfig()
	var s State
	r, _, _ := Reserve(c, &s, t0, Ask{Client: "a", Tokens: 3, Duration: sec, Priority: Normal})
	if s.Virtual != 0 || s.Clients["a"].Finish != 3*VirtualScale {
		t.Fatalf("state %+v", s)
	}
	Release(c, &s, t0, r.ID)
	if len(s.Clients) == 0 {
		t.Fatalf("forgot the client while its released record lives")
	}
	Expire(c, &s, t0+sec)
	if s.Held != 0 || s.Virtual != 0 || len(s.Clients) != 0 || len(s.Queue) != 0 || len(s.Granted) != 0 {
		t.Fatalf("idle pool: %+v, want the zero state (but for LastID)", s)
	}
}
