package envoyrls

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
)

// keyLog is a store that records every key it is asked about.
type keyLog struct {
	engine.Store
	mu   sync.Mutex
	keys []string
}

func (l *keyLog) Do(ctx context.Context, b *store.Batch) error {
	l.mu.Lock()
	for _, r := range b.Reqs {
		l.keys = append(l.keys, r.Key)
	}
	l.mu.Unlock()
	return l.Store.Do(ctx, b)
}

func (l *keyLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.keys
	l.keys = nil
	return k
}

const keysPolicy = `
version: 1
envoy:
  - domain: "edge:1"
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: path
        value: "/api/*"
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 3}
      - key: "a=b"
        rate_limit: {unit: hour, requests_per_unit: 3, global_requests_per_unit: 2}
`

// TestStoreKeysPinned pins the store keys written for representative
// descriptors, byte for byte (internal/engine's TestStoreKeysPinned pins
// those of rules): state kept in Redis by one version must be found by
// the next, so these strings never change unless the layout's
// documentation says why.
func TestStoreKeysPinned(t *testing.T) {
	p, err := policy.Parse("keys.yaml", []byte(keysPolicy))
	if err != nil {
		t.Fatal(err)
	}
	log := &keyLog{Store: newStore(t)}
	eng, err := engine.New(engine.Config{Store: log, Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }, Global: &view{}})
	if err != nil {
		t.Fatal(err)
	}
	e := NewDecider(eng, false)
	ctx := context.Background()
	for _, tt := range []struct {
		desc Descriptor
		want []string
	}{
		{descOf("remote_address", "10.0.0.1"), []string{"rl:envoy:edge%3A1:fw.1m0s:{remote_address=10.0.0.1}"}},
		{descOf("path", "/api/v1"), []string{"rl:envoy:edge%3A1:fw.1s:{path=/api/*}"}},
		{descOf("a=b", "c:d"), []string{"rl:envoy:edge%3A1:fw.1h0m0s:{a%3Db=c%3Ad}", "rl:envoy:edge%3A1:@g:{a%3Db=c%3Ad}"}},
		{Descriptor{Entries: descOf("remote_address", "10.0.0.1").Entries, Limit: LimitOverride{RequestsPerUnit: 7, Unit: time.Minute}},
			[]string{"rl:envoy:edge%3A1:override.fw.1m0s.q1000:{remote_address=10.0.0.1}"}},
		{descOf("remote_address", strings.Repeat("{", 400)), []string{
			"rl:envoy:edge%3A1:fw.1m0s:{9253}#6d2f5ff86017b3a18fc5b7befadd6c48da0146135174aa104a885669b589c2fb"}},
	} {
		if _, _, err := e.ShouldRateLimit(ctx, "edge:1", []Descriptor{tt.desc}, 1); err != nil {
			t.Fatalf("ShouldRateLimit(%+v): %v", tt.desc, err)
		}
		if got := log.take(); !slices.Equal(got, tt.want) {
			t.Errorf("ShouldRateLimit(%+v) keys:\n got %q\nwant %q", tt.desc, got, tt.want)
		}
	}
}

// eventLog keeps the analytics events the engine hands over.
type eventLog struct{ evs []analytics.Event }

func (l *eventLog) Record(ev analytics.Event) { l.evs = append(l.evs, ev) }

// TestAnalyticsEvents: one event per Envoy call (internal/engine's
// TestAnalyticsEvents: per check), whose client is the value of the first
// entry of the first descriptor and whose rule is its key.
func TestAnalyticsEvents(t *testing.T) {
	log := &eventLog{}
	p, err := policy.Parse("test.yaml", []byte(`version: 1
envoy:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: newStore(t), Local: newStore(t), Policy: p, Now: func() time.Time { return t0 },
		Analytics: log})
	if err != nil {
		t.Fatal(err)
	}
	e := NewDecider(eng, false)
	ctx := context.Background()
	for range 2 {
		if _, _, err := e.ShouldRateLimit(ctx, "edge", []Descriptor{{Entries: []DescriptorEntry{{Key: "remote_address", Value: "10.0.0.1"}}}}, 1); err != nil {
			t.Fatal(err)
		}
	}
	want := []analytics.Event{
		{Client: "10.0.0.1", Resource: "edge", Rule: "remote_address", Allowed: true, Cost: 1},
		{Client: "10.0.0.1", Resource: "edge", Rule: "remote_address", Reason: analytics.ReasonOverLimit, Cost: 1},
	}
	if len(log.evs) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(log.evs), len(want), log.evs)
	}
	for i, got := range log.evs {
		if !got.Time.Equal(t0) || got.Region != "local" || got.Latency <= 0 {
			t.Errorf("event %d: time %v, region %q, latency %v", i, got.Time, got.Region, got.Latency)
		}
		got.Time, got.Region, got.Latency = time.Time{}, "", 0
		if got != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, got, want[i])
		}
	}
}

// keyWatch is a store that records the longest key it is asked about.
type keyWatch struct {
	engine.Store
	mu      sync.Mutex
	longest int
}

func (w *keyWatch) Do(ctx context.Context, b *store.Batch) error {
	w.mu.Lock()
	for _, r := range b.Reqs {
		w.longest = max(w.longest, len(r.Key))
	}
	w.mu.Unlock()
	return w.Store.Do(ctx, b)
}

// TestLongKeysCount: Envoy descriptors whose store keys would be KiB long
// (a descriptor of escaped bytes) reach the store with keys of at most
// policy.MaxKeyBytes and are counted each on its own key, alike on the
// memory store and on Redis (internal/engine's TestLongKeysCount: checks).
func TestLongKeysCount(t *testing.T) {
	p, err := policy.Parse("test.yaml", []byte(`
version: 1
envoy:
  - domain: edge
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 2}
        descriptors:
          - {key: user, rate_limit: {unit: minute, requests_per_unit: 2}}
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, newSt := range stores(t) {
		t.Run(name, func(t *testing.T) {
			w := &keyWatch{Store: newSt(t)}
			eng, err := engine.New(engine.Config{Store: w, Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }})
			if err != nil {
				t.Fatal(err)
			}
			e := NewDecider(eng, false)
			ctx := context.Background()
			// 3 KiB escaped.
			d := descOf("path", strings.Repeat(":", 512), "user", strings.Repeat(":", 511)+"1")
			other := descOf("path", strings.Repeat(":", 512), "user", strings.Repeat(":", 511)+"2")
			for i, want := range []bool{false, false, true} {
				st, over, err := e.ShouldRateLimit(ctx, "edge", []Descriptor{d}, 1)
				if err != nil {
					t.Fatal(err)
				}
				if over != want || !st[0].HasLimit {
					t.Errorf("Envoy call %d: over limit %v, want %v (%+v)", i+1, over, want, st[0])
				}
			}
			if _, over, err := e.ShouldRateLimit(ctx, "edge", []Descriptor{other}, 1); err != nil || over {
				t.Errorf("another long descriptor: over limit %v, %v; want counted apart", over, err)
			}
			if w.longest == 0 || w.longest > policy.MaxKeyBytes {
				t.Errorf("the store saw keys of up to %d bytes, want at most %d", w.longest, policy.MaxKeyBytes)
			}
		})
	}
}
