package guard

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoyrls"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestEnvoyOverLimitCacheReportsOtherLimitsTrueState checks, on a real
// Redis, that when the over-limit cache denies one limit of a request,
// the request's other limits report their state as it stands (read from
// the store, nothing consumed), not a remaining of 0: in the Envoy API
// and in a check of several rules (the HTTP and gRPC APIs).
func TestEnvoyOverLimitCacheReportsOtherLimitsTrueState(t *testing.T) {
	srv := redistest.Start(t)
	pol, err := policy.Parse("t.yaml", []byte(`version: 1
rules:
  - { id: few,  match: { resource: /r }, algorithm: fixed_window, limit: 2, window: 1m }
  - { id: many, match: { resource: /r }, algorithm: fixed_window, limit: 100, window: 1m, dimension: endpoint }
envoy:
  - domain: d
    descriptors:
      - key: few
        rate_limit: { unit: minute, requests_per_unit: 2 }
      - key: many
        rate_limit: { unit: minute, requests_per_unit: 100 }
`))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	g := newGuard(t, rs, Config{Deadline: time.Second})
	eng, err := engine.New(engine.Config{Store: g, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	descs := []envoyrls.Descriptor{
		{Entries: []envoyrls.DescriptorEntry{{Key: "few", Value: "x"}}},
		{Entries: []envoyrls.DescriptorEntry{{Key: "many", Value: "x"}}},
	}
	var st []envoyrls.DescriptorStatus
	for i := range 4 {
		st, _, err = envoyrls.NewDecider(eng, false).ShouldRateLimit(ctx, "d", descs, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("request %d: %+v", i, st)
	}
	hits := g.Stats().OverLimitHits
	if hits == 0 {
		t.Fatalf("the over-limit cache answered nothing")
	}
	// Two admitted requests charged the second limit twice; the refused
	// ones charged nothing.
	if !st[0].OverLimit || st[1].OverLimit || st[1].Remaining != 98 || st[1].DurationUntilReset <= 0 {
		t.Errorf("Envoy, over-limit cache answering: got %+v, want the first over and the second with 98 remaining", st)
	}

	for range 4 {
		r, err := eng.Check(ctx, &engine.Check{ClientID: "c", Resource: "/r", Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			continue
		}
		if r.Rules[0].Source != engine.SourceOverLimitCache {
			continue
		}
		if got := r.Rules[1]; got.Remaining != 98 || got.ResetAfter <= 0 || got.Limit != 100 {
			t.Errorf("check, over-limit cache answering: rule %s reports %+v, want 98 of 100 remaining and a reset", got.Rule, got)
		}
		return
	}
	t.Errorf("no check was answered by the over-limit cache")
}
