package guard

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoyrls"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestEngineReportsSources runs the engine on a guard: the over-limit
// cache and the hot-key tier show as decision sources, and a store that
// fails gives each rule its failure mode.
func TestEngineReportsSources(t *testing.T) {
	pol, err := policy.Parse("t.yaml", []byte(`version: 1
rules:
  - { id: few,  match: { resource: /few },  algorithm: fixed_window, limit: 2, window: 1m }
  - { id: many, match: { resource: /many }, algorithm: sliding_window_counter, limit: 100000000, window: 1m }
  - { id: shut, match: { resource: /shut }, limit: 5, window: 1m, failure_mode: fail_closed }
  - { id: loc,  match: { resource: /loc },  algorithm: fixed_window, limit: 4, window: 1m, failure_mode: local, expected_instances: 2 }
`))
	if err != nil {
		t.Fatal(err)
	}
	f := &guardtest.Faulty{Inner: newMemory(t, nil)}
	obs := &countObserver{}
	g := newGuard(t, f, Config{Observer: obs, Deadline: time.Second, HotKeys: HotKeyConfig{Enabled: true, Threshold: 200, SyncInterval: 5 * time.Millisecond, Window: 50 * time.Millisecond}})
	eng, err := engine.New(engine.Config{Store: g, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func(res string) engine.Result {
		t.Helper()
		r, err := eng.Check(ctx, &engine.Check{ClientID: "c", Resource: res, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var got []string
	for range 4 {
		r := check("/few")
		got = append(got, r.Source.String())
	}
	if want := "[store store store over_limit_cache]"; fmtList(got) != want {
		t.Errorf("/few sources %v, want %s", got, want)
	}
	if r := check("/few"); r.Allowed || r.Deciding.RetryAfter <= 0 || r.Deciding.Rule != "few" {
		t.Errorf("cached denial: %+v", r)
	}
	hot := 0
	for range 2000 {
		r := check("/many")
		if !r.Allowed {
			t.Fatalf("/many denied: %+v", r)
		}
		if r.Source == engine.SourceHotKey {
			hot++
		}
		time.Sleep(10 * time.Microsecond)
	}
	if hot == 0 {
		t.Errorf("no check of a key checked 2000 times was decided by the hot-key tier")
	}
	t.Logf("%d of 2000 checks decided by the hot-key tier", hot)
	// The key may be detected more than once: on a loaded machine (the
	// race detector, other test packages) a detection window can see it
	// checked too few times, and it leaves the tier until the next.
	if obs.olc.Load() != 2 || obs.entries.Load() != 1 || obs.detected.Load() < 1 || obs.hot.Load() != 1 || obs.syncs.Load() == 0 {
		t.Errorf("observer: %d over-limit hits (want 2), %d keys detected (want at least 1), %d hot (want 1), %d syncs",
			obs.olc.Load(), obs.detected.Load(), obs.hot.Load(), obs.syncs.Load())
	}

	f.SetDown(true)
	if r := check("/shut"); r.Allowed || !r.Unavailable || r.Source != engine.SourceFailClosed {
		t.Errorf("fail_closed with the store down: %+v", r)
	}
	var loc []bool
	for range 3 {
		r := check("/loc")
		if r.Source != engine.SourceLocal {
			t.Errorf("local: source %s", r.Source)
		}
		loc = append(loc, r.Allowed)
	}
	if fmtBools(loc) != "[true true false]" {
		t.Errorf("local share of 4 over 2 instances: %v", loc)
	}
	if err := eng.Ready(ctx); err == nil {
		t.Error("Ready with the store down: no error")
	}
}

// TestEnginePrioritiesShareNoCachedDenial: a client's low-priority checks
// (limit 10 x 0.8 = 8) and normal ones (10) count on one key. A
// low-priority denial does not deny, from the over-limit cache, the
// normal-priority checks the store still has room for.
func TestEnginePrioritiesShareNoCachedDenial(t *testing.T) {
	eng := tenPerHour(t, newMemory(t, nil), time.Second)
	ctx := context.Background()
	check := func(pr engine.Priority) engine.Result {
		t.Helper()
		r, err := eng.Check(ctx, &engine.Check{ClientID: "c", Resource: "/r", Cost: 1, Priority: pr})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i := range 10 {
		r := check(engine.PriorityLow)
		if want := i < 8; r.Allowed != want {
			t.Fatalf("low-priority check %d: allowed %v from %s, want %v", i, r.Allowed, r.Source, want)
		}
	}
	for i := range 3 {
		r := check(engine.PriorityNormal)
		if want := i < 2; r.Allowed != want {
			t.Errorf("normal-priority check %d with %d of 10 used: allowed %v from %s (retry after %s), want %v",
				i, 8+i, r.Allowed, r.Source, r.Deciding.RetryAfter.Round(time.Second), want)
		}
	}
}

// TestEngineRefusedBatchLeavesNoCachedDenial: an all-or-nothing batch of
// two checks of one client puts one key twice in a CheckAll. With one unit
// left, the store decides the second request on the state the first
// leaves and denies it with a retry-after; the batch consumes nothing. That
// denial is not remembered: the unit is still there, and the next single
// check is admitted by the store.
func TestEngineRefusedBatchLeavesNoCachedDenial(t *testing.T) {
	for _, tc := range []struct {
		name     string
		newStore func(t *testing.T) Store
	}{
		{"memory", func(t *testing.T) Store { return newMemory(t, nil) }},
		{"redis", func(t *testing.T) Store {
			srv := redistest.Start(t)
			st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := tenPerHour(t, tc.newStore(t), 2*time.Second)
			ctx := context.Background()
			c := engine.Check{ClientID: "c", Resource: "/r", Cost: 1}
			for range 9 {
				if r, err := eng.Check(ctx, &c); err != nil || !r.Allowed {
					t.Fatalf("within the limit: %+v %v", r, err)
				}
			}
			out, err := eng.BatchCheck(ctx, []engine.Check{c, c}, engine.AllOrNothing)
			if err != nil {
				t.Fatal(err)
			}
			if out[0].Allowed || out[1].Allowed {
				t.Fatalf("batch of 2 with 1 unit left admitted")
			}
			r, err := eng.Check(ctx, &c)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Allowed || r.Source != engine.SourceStore {
				t.Errorf("single check with 1 of 10 left after a refused batch: allowed %v from %s (retry after %s), want admitted by the store",
					r.Allowed, r.Source, r.Deciding.RetryAfter.Round(time.Second))
			}
		})
	}
}

// TestShadowOnlyIdempotencyOnRedis: two engines share a Redis store
// through their guards, as two daemons do. A check with an idempotency key
// that applies only a shadow rule is charged once; its repeats, on either
// engine, answer from the record.
func TestShadowOnlyIdempotencyOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	pol, err := policy.Parse("t.yaml", []byte(`version: 1
rules:
  - {id: shadow, limit: 100, window: 1h, algorithm: fixed_window, shadow: true}
  - {id: per-user, dimension: user, limit: 10, window: 1h, algorithm: fixed_window}
`))
	if err != nil {
		t.Fatal(err)
	}
	var engines [2]*engine.Engine
	for i := range engines {
		st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		g := newGuard(t, st, Config{Deadline: 2 * time.Second})
		if engines[i], err = engine.New(engine.Config{Store: g, Policy: pol}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	c := engine.Check{ClientID: "x", Cost: 1, IdempotencyKey: "k"}
	first, err := engines[0].Check(ctx, &c)
	if err != nil || len(first.Rules) != 1 || first.Rules[0].Cost != 1 {
		t.Fatalf("first: %+v, %v; want the shadow rule charged 1", first.Rules, err)
	}
	for i, e := range engines {
		r, err := e.Check(ctx, &c)
		if err != nil || r.Source != engine.SourceIdempotent || r.Rules[0].Cost != 0 {
			t.Errorf("repeat on engine %d: source %s, rules %+v, %v; want idempotent, cost 0", i, r.Source, r.Rules, err)
		}
	}
	st, err := engines[1].Status(ctx, &engine.Check{ClientID: "x"})
	if err != nil || len(st) == 0 || st[0].Remaining != 99 {
		t.Errorf("shadow rule after three checks of one key: %+v, %v; want 99 remaining (charged once)", st, err)
	}
}

// tenPerHour returns an engine over st, through a guard with the given
// deadline, whose one rule admits 10 checks of resource /r per client and
// hour (fixed window).
func tenPerHour(t *testing.T, st Store, deadline time.Duration) *engine.Engine {
	t.Helper()
	pol, err := policy.Parse("t.yaml", []byte(`version: 1
rules:
  - { id: r, match: { resource: /r }, algorithm: fixed_window, limit: 10, window: 1h }
`))
	if err != nil {
		t.Fatal(err)
	}
	g := newGuard(t, st, Config{Deadline: deadline})
	eng, err := engine.New(engine.Config{Store: g, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func fmtBools(b []bool) string {
	s := make([]string, len(b))
	for i, v := range b {
		s[i] = "false"
		if v {
			s[i] = "true"
		}
	}
	return fmtList(s)
}

// TestLongKeysBoundTheCaches: callers that send many distinct long
// resources and Envoy descriptors (keys of KiB once escaped) fill the
// over-limit cache and the hot-key tier with keys of at most
// policy.MaxKeyBytes each, so that the caches' bounds by count bound their
// bytes: MaxKeys x MaxKeyBytes at most, whatever the callers send.
func TestLongKeysBoundTheCaches(t *testing.T) {
	pol, err := policy.Parse("t.yaml", []byte(`version: 1
rules:
  - { id: few,  match: { resource: "/few/*" }, dimension: client+endpoint, algorithm: fixed_window, limit: 1, window: 1m }
  - { id: many, match: { resource: "/many/*" }, dimension: client+endpoint, algorithm: sliding_window_counter, limit: 100000000, window: 1m }
envoy:
  - domain: edge
    descriptors:
      - { key: path, rate_limit: { unit: minute, requests_per_unit: 1 } }
`))
	if err != nil {
		t.Fatal(err)
	}
	const maxKeys = 64
	g := newGuard(t, newMemory(t, nil), Config{Deadline: time.Second, OverLimit: OverLimitConfig{MaxKeys: maxKeys},
		HotKeys: HotKeyConfig{Enabled: true, Threshold: 200, SyncInterval: 5 * time.Millisecond, Window: 50 * time.Millisecond}})
	eng, err := engine.New(engine.Config{Store: g, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pad := strings.Repeat(":", engine.MaxResourceLen-16) // 6 KiB escaped
	for i := range 2 * maxKeys {
		res := "/few/" + strconv.Itoa(i) + pad
		for range 3 { // admitted, denied by the store, denied from the cache
			if _, err := eng.Check(ctx, &engine.Check{ClientID: "c", Resource: res, Cost: 1}); err != nil {
				t.Fatal(err)
			}
		}
		d := envoyrls.Descriptor{Entries: []envoyrls.DescriptorEntry{{Key: "path", Value: strconv.Itoa(i) + strings.Repeat(":", 500)}}}
		for range 3 {
			if _, _, err := envoyrls.NewDecider(eng, false).ShouldRateLimit(ctx, "edge", []envoyrls.Descriptor{d}, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	hot := 0
	for range 2000 {
		r, err := eng.Check(ctx, &engine.Check{ClientID: "c", Resource: "/many/" + pad, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if r.Source == engine.SourceHotKey {
			hot++
		}
		time.Sleep(10 * time.Microsecond)
	}

	n, bytes, longest := 0, 0, 0
	for i := range g.olc.shards {
		sh := &g.olc.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			n, bytes, longest = n+1, bytes+len(k), max(longest, len(k))
		}
		sh.mu.Unlock()
	}
	if n == 0 || n > maxKeys || longest > policy.MaxKeyBytes {
		t.Errorf("over-limit cache: %d keys of up to %d bytes, want 1 to %d keys of at most %d bytes", n, longest, maxKeys, policy.MaxKeyBytes)
	}
	t.Logf("over-limit cache: %d keys, %d bytes of keys", n, bytes)
	if hot == 0 {
		t.Error("no check of a key checked 2000 times was decided by the hot-key tier")
	}
	for k := range mapOrNil(g.hot.keys.Load()) {
		if len(k) > policy.MaxKeyBytes {
			t.Errorf("hot key of %d bytes, want at most %d", len(k), policy.MaxKeyBytes)
		}
	}
}
