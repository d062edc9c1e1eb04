package engine

import (
	"context"
	"testing"
)

const quotaConfig = `
domain: q
descriptors:
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// TestShouldRateLimitQuotaMode checks envoyproxy/ratelimit's quota_mode: a
// quota over its limit reports OVER_LIMIT in its own status only, and the
// request is over the limit once every quota of it is.
func TestShouldRateLimitQuotaMode(t *testing.T) {
	e, _ := newEngine(t, quotaConfig)
	ctx := context.Background()
	ds := []Descriptor{desc("quota_a", "x"), desc("quota_b", "x"), desc("plain", "x")}
	for i, want := range []struct{ a, b, over bool }{
		{false, false, false},
		{true, false, false}, // a is over, b is not: OK
		{true, true, true},   // both quotas over: over the limit
	} {
		st, over, err := e.ShouldRateLimit(ctx, "q", ds, 1)
		if err != nil {
			t.Fatal(err)
		}
		if st[0].OverLimit != want.a || st[1].OverLimit != want.b || over != want.over || st[2].OverLimit {
			t.Fatalf("call %d: got %+v over %v, want quota_a %v, quota_b %v, over %v", i+1, st, over, want.a, want.b, want.over)
		}
	}
	// A quota over its limit does not keep the plain limit from counting
	// (as in envoyproxy/ratelimit, which counts every descriptor).
	read := desc("plain", "x")
	read.HitsSet = true
	st, _, _ := e.ShouldRateLimit(ctx, "q", []Descriptor{read}, 0)
	if st[0].Remaining != 2 {
		t.Errorf("plain remaining after three requests: got %d, want 2", st[0].Remaining)
	}
}
