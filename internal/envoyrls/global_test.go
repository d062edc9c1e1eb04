package envoyrls

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// view is a GlobalView whose other regions are fixed by the test.
type view struct {
	mu       sync.Mutex
	seen     int64
	reserve  int64
	observed map[string]int64 // key@start -> count
}

func (v *view) Allowance(key string, start int64, length time.Duration, limit int64) int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return limit - v.seen - v.reserve
}

func (v *view) Observe(key string, start int64, length time.Duration, count int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.observed == nil {
		v.observed = map[string]int64{}
	}
	v.observed[key] = max(v.observed[key], count)
}

// flakyStore fails every call while down is set.
type flakyStore struct {
	engine.Store
	down atomic.Bool
}

func (s *flakyStore) Do(ctx context.Context, b *store.Batch) error {
	if s.down.Load() {
		return fmt.Errorf("%w: test outage", sluice.ErrStoreUnavailable)
	}
	return s.Store.Do(ctx, b)
}

// newGlobalEngine returns the Decider of an engine on the policy src with
// the global view v, at t0, and the store it decides on, up.
func newGlobalEngine(t *testing.T, v engine.GlobalView, src string) (*Decider, *flakyStore) {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	st, err := memory.New(memory.Config{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	fs := &flakyStore{Store: st}
	eng, err := engine.New(engine.Config{Store: fs, Policy: p, Now: func() time.Time { return t0 }, Global: v})
	if err != nil {
		t.Fatal(err)
	}
	return NewDecider(eng, false), fs
}

// Envoy's descriptors take a global limit through Sluice's extension,
// global_requests_per_unit: a descriptor is over when either limit is.
func TestGlobalLimitEnvoy(t *testing.T) {
	const src = `
domain: edge
descriptors:
  - key: partner
    rate_limit: { unit: minute, requests_per_unit: 10, global_requests_per_unit: 4 }
`
	v := &view{seen: 1}
	e, _ := newGlobalEngine(t, v, src)
	for i := range 4 {
		st, over, err := e.ShouldRateLimit(context.Background(), "edge", []Descriptor{descOf("partner", "p1")}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := i == 3; over != want || st[0].Limit != 10 || st[0].Remaining != max(int64(2-i), 0) {
			t.Errorf("hit %d: over %v, %+v; want over %v with %d remaining", i, over, st[0], want, max(2-i, 0))
		}
	}
	if len(v.observed) != 1 {
		t.Errorf("observed %v, want the descriptor's global key", v.observed)
	}
	for _, bad := range []string{"0", "-1", "x", "5000000000"} {
		src := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, global_requests_per_unit: " + bad + " }\n"
		if _, err := policy.Parse("e.yaml", []byte(src)); err == nil {
			t.Errorf("global_requests_per_unit %s: parsed", bad)
		}
	}
}

// An Envoy descriptor with global_requests_per_unit alone is decided by
// its global limit alone, which its status reports; a shadow or quota
// mode descriptor, which would enforce nothing, and an algorithm are
// refused.
func TestGlobalOnlyEnvoy(t *testing.T) {
	const src = `
domain: edge
descriptors:
  - key: partner
    rate_limit: { unit: minute, global_requests_per_unit: 4 }
`
	v := &view{seen: 1}
	e, fs := newGlobalEngine(t, v, src)
	for i := range 4 {
		st, over, err := e.ShouldRateLimit(context.Background(), "edge", []Descriptor{descOf("partner", "p1")}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := i == 3; over != want || st[0].Limit != 4 || st[0].Remaining != max(int64(2-i), 0) || st[0].Unit != time.Minute {
			t.Errorf("hit %d: over %v, %+v; want over %v, limit 4 with %d remaining", i, over, st[0], want, max(2-i, 0))
		}
	}
	if len(v.observed) != 1 {
		t.Errorf("observed %v, want the descriptor's global key", v.observed)
	}
	for k := range v.observed {
		if !strings.Contains(k, ":@g:") {
			t.Errorf("counted on %q, want the global key alone", k)
		}
	}
	// While the store cannot answer, each instance admits the whole
	// global limit on its own (an Envoy file names no expected instances).
	fs.down.Store(true)
	for i := range 5 {
		st, over, err := e.ShouldRateLimit(context.Background(), "edge", []Descriptor{descOf("partner", "p2")}, 1)
		if want := i == 4; err != nil || over != want {
			t.Errorf("store down, hit %d: over %v, %+v, %v; want over %v", i, over, st, err, want)
		}
	}
	for _, tc := range []struct{ limit, want string }{
		{"{ unit: second }", "missing requests_per_unit (or global_requests_per_unit"},
		{"{ unit: second, global_requests_per_unit: 5, algorithm: gcra }", "rate_limit.algorithm: a rate limit with only global_requests_per_unit"},
		{"{ unit: second, global_requests_per_unit: 0 }", "rate_limit.global_requests_per_unit: must be between 1"},
		{"{ global_requests_per_unit: 5 }", "missing unit"},
	} {
		src := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + tc.limit + "\n"
		if _, err := policy.Parse("e.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.limit, err, tc.want)
		}
	}
	for _, mode := range []string{"shadow_mode", "quota_mode"} {
		src := "domain: d\ndescriptors:\n  - key: k\n    " + mode + ": true\n    rate_limit: { unit: second, global_requests_per_unit: 5 }\n"
		if _, err := policy.Parse("e.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), "does not enforce a global limit") {
			t.Errorf("%s: %v, want refused", mode, err)
		}
	}
}
