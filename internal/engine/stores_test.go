package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// onStores runs f on an engine of the policy src over each store the
// engine is deployed on: the memory store (idempotency records kept in
// process) and a real Redis (records kept by the store).
func onStores(t *testing.T, src string, f func(t *testing.T, e *Engine)) {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("memory", func(t *testing.T) {
		e, err := New(Config{Store: newStore(t), Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		f(t, e)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		e, err := New(Config{Store: st, Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		f(t, e)
	})
}

// TestIdempotencyKeyReusedOnOtherCounters: a key that comes back on a
// check counting on other keys (another resource, with other rules) is
// another request: it is decided and charged on its own, on every store,
// and the first request's record stays, so that its own retry still
// charges nothing.
func TestIdempotencyKeyReusedOnOtherCounters(t *testing.T) {
	onStores(t, `
version: 1
rules:
  - {id: all, limit: 100, window: 1m, algorithm: fixed_window}
  - {id: b, match: {resource: /b}, limit: 10, window: 1m, algorithm: fixed_window}
  - {id: c, match: {resource: /c}, limit: 3, window: 1m, algorithm: fixed_window}
`, func(t *testing.T, e *Engine) {
		ctx := context.Background()
		first := mustCheck(t, e, Check{ClientID: "x", Resource: "/b", Cost: 2, IdempotencyKey: "k"})
		if !first.Allowed || first.Source != SourceStore {
			t.Fatalf("first check: allowed %v from %s, want admitted by the store", first.Allowed, first.Source)
		}
		// The same key on /c (rules all and c, as many as the first's)
		// and on /other (rule all alone).
		for _, tt := range []struct {
			resource string
			rules    []string
			cost     int64 // what rule all is charged
		}{
			{"/c", []string{"all", "c"}, 3},
			{"/other", []string{"all"}, 4},
		} {
			r := mustCheck(t, e, Check{ClientID: "x", Resource: tt.resource, Cost: tt.cost, IdempotencyKey: "k"})
			if r.Source == SourceIdempotent || !r.Allowed || len(r.Rules) != len(tt.rules) {
				t.Errorf("key k on %s: allowed %v from %s with rules %+v; want rules %v decided by the store",
					tt.resource, r.Allowed, r.Source, r.Rules, tt.rules)
				continue
			}
			for i, rr := range r.Rules {
				if rr.Rule != tt.rules[i] || rr.Cost != tt.cost || rr.Remaining > rr.Limit {
					t.Errorf("key k on %s: rule %d is %+v, want %s charged %d", tt.resource, i, rr, tt.rules[i], tt.cost)
				}
			}
		}
		// The first request's retry replays its decision.
		again := mustCheck(t, e, Check{ClientID: "x", Resource: "/b", Cost: 2, IdempotencyKey: "k"})
		if again.Source != SourceIdempotent || again.Deciding.Cost != 0 || again.Deciding.Remaining != first.Deciding.Remaining {
			t.Errorf("retry of the first request: source %s, cost %d, remaining %d; want idempotent, cost 0, remaining %d",
				again.Source, again.Deciding.Cost, again.Deciding.Remaining, first.Deciding.Remaining)
		}
		st, err := e.Status(ctx, &Check{ClientID: "x", Resource: "/c", Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		// all: 2 + 3 + 4 charged; b: 2; c: 3.
		if st[0].Remaining != 91 || st[1].Remaining != 0 {
			t.Errorf("remaining of all and c: %d and %d, want 91 and 0", st[0].Remaining, st[1].Remaining)
		}
		st, err = e.Status(ctx, &Check{ClientID: "x", Resource: "/b", Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		if st[1].Remaining != 8 {
			t.Errorf("remaining of b: %d, want 8 (charged once)", st[1].Remaining)
		}
	})
}

// TestDenialThatCanNeverBeAdmittedHasNoRetry: a check denied by a rule
// that is exhausted for now and by one it can never pass (its cost is
// above the rule's capacity) reports the rule it can never pass and no
// retry-after, whatever the rules' order: a retry would be denied again.
func TestDenialThatCanNeverBeAdmittedHasNoRetry(t *testing.T) {
	onStores(t, `
version: 1
rules:
  - {id: per-client, limit: 100, window: 1m, algorithm: fixed_window}
  - {id: small, match: {resource: /small}, limit: 5, window: 1m, algorithm: fixed_window}
  - {id: per-user, dimension: user, limit: 100, window: 1m, algorithm: fixed_window}
`, func(t *testing.T, e *Engine) {
		mustCheck(t, e, Check{ClientID: "x", Resource: "/other", Cost: 100})            // per-client of x used up
		mustCheck(t, e, Check{ClientID: "y", User: "u", Resource: "/other", Cost: 100}) // per-user of u used up
		for _, c := range []Check{
			{ClientID: "x", Resource: "/small", Cost: 10},            // per-client (for a minute), small (never)
			{ClientID: "z", User: "u", Resource: "/small", Cost: 10}, // small (never), per-user (for a minute)
		} {
			r := mustCheck(t, e, c)
			if r.Allowed || r.Deciding.Rule != "small" || r.Deciding.RetryAfter != 0 {
				t.Errorf("client %s: allowed %v, deciding rule %s with retry-after %v; want denied by small with no retry-after (rules %+v)",
					c.ClientID, r.Allowed, r.Deciding.Rule, r.Deciding.RetryAfter, r.Rules)
			}
		}
	})
}

// keyWatch is a store that records the longest key it is asked about.
type keyWatch struct {
	Store
	mu      sync.Mutex
	longest int
}

func (w *keyWatch) watch(reqs []store.Request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range reqs {
		w.longest = max(w.longest, len(r.Key))
	}
}

func (w *keyWatch) Do(ctx context.Context, b *store.Batch) error {
	w.watch(b.Reqs)
	return w.Store.Do(ctx, b)
}

// TestLongKeysCount: checks whose store keys would be KiB long (a long
// resource of escaped bytes) reach the store with keys of at most
// policy.MaxKeyBytes, are counted each on its own key, alike on the
// memory store and on Redis, and are reset on the key they count on
// (internal/envoyrls' TestLongKeysCount: Envoy descriptors).
func TestLongKeysCount(t *testing.T) {
	p, err := policy.Parse("test.yaml", []byte(`
version: 1
rules:
  - {id: per-path, dimension: user+endpoint, limit: 2, window: 1m, algorithm: fixed_window}
`))
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]func(t *testing.T) Store{
		"memory": func(t *testing.T) Store { return newStore(t) },
		"redis": func(t *testing.T) Store {
			srv := redistest.Start(t)
			st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
	}
	for name, newSt := range stores {
		t.Run(name, func(t *testing.T) {
			w := &keyWatch{Store: newSt(t)}
			e, err := New(Config{Store: w, Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			long := "/" + strings.Repeat(":", MaxResourceLen-1) // 6 KiB escaped
			for i, want := range []bool{true, true, false} {
				if r := mustCheck(t, e, Check{ClientID: "c", User: "u", Resource: long, Cost: 1}); r.Allowed != want {
					t.Errorf("check %d of the long resource: allowed %v, want %v (%+v)", i+1, r.Allowed, want, r)
				}
			}
			if r := mustCheck(t, e, Check{ClientID: "c", User: "u", Resource: long[:len(long)-1] + "x", Cost: 1}); !r.Allowed {
				t.Error("another long resource was counted with the first")
			}
			if err := e.Reset(ctx, &Check{ClientID: "c", User: "u", Resource: long}); err != nil {
				t.Fatal(err)
			}
			if r := mustCheck(t, e, Check{ClientID: "c", User: "u", Resource: long, Cost: 1}); !r.Allowed {
				t.Error("the long resource is still denied after its reset")
			}

			if w.longest == 0 || w.longest > policy.MaxKeyBytes {
				t.Errorf("the store saw keys of up to %d bytes, want at most %d", w.longest, policy.MaxKeyBytes)
			}
		})
	}
}
