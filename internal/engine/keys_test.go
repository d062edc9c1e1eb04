package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
)

// keyLog is a store that records every key it is asked about, and the key
// of every idempotency record.
type keyLog struct {
	Store
	mu   sync.Mutex
	keys []string
}

func (l *keyLog) Do(ctx context.Context, b *store.Batch) error {
	l.mu.Lock()
	for _, r := range b.Reqs {
		l.keys = append(l.keys, r.Key)
	}
	if b.Once != nil {
		l.keys = append(l.keys, "once "+b.Once.Key)
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
tiers:
  free: {limit: 10, window: 1m, algorithm: token_bucket}
  big: {limit: 1000000, window: 24h, algorithm: token_bucket}
rules:
  - {id: per-client, match: {resource: "/c/*"}, limit: 5, window: 1m, algorithm: fixed_window}
  - {id: orders, match: {resource: "/orders/*"}, dimension: user+endpoint, limit: 5, window: 1s, algorithm: token_bucket}
  - {id: by-ip, match: {resource: "/ip"}, dimension: ip+method, limit: 5, window: 10s, algorithm: sliding_window_counter}
  - {id: everyone, match: {resource: "/all"}, dimension: global, limit: 5, window: 1s, algorithm: gcra}
  - {id: plans, match: {resource: "/plan"}, tiered: true}
  - {id: log, match: {resource: "/log"}, dimension: api_key, limit: 5, window: 1h, algorithm: sliding_window_log}
  - {id: leaky, match: {resource: "/leak"}, limit: 5, window: 1m, algorithm: leaky_bucket}
  - {id: world, match: {resource: "/world"}, limit: 100, window: 1m, global_limit: 50}
assignments:
  - {client: acme, tier: free}
  - {client: huge, tier: big}
`

// TestStoreKeysPinned pins the store keys the engine writes for
// representative rules (internal/envoyrls' TestStoreKeysPinned pins those
// of descriptors), byte for byte: state kept in Redis by one version must
// be found by the next, so these strings never change unless the layout's
// documentation says why.
func TestStoreKeysPinned(t *testing.T) {
	p, err := policy.Parse("keys.yaml", []byte(keysPolicy))
	if err != nil {
		t.Fatal(err)
	}
	log := &keyLog{Store: &onceStore{Store: newStore(t), records: map[string]onceRecord{}}}
	e, err := New(Config{Store: log, Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }, Global: &view{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	long := "/orders/" + strings.Repeat("%", 400)
	for _, tt := range []struct {
		check Check
		want  []string
	}{
		{Check{ClientID: "acme", Resource: "/c/x", Cost: 1}, []string{"rl:per-client:fw.1m0s:{client=acme}"}},
		{Check{ClientID: "a:b{c}%", Resource: "/c/x", Cost: 1}, []string{"rl:per-client:fw.1m0s:{client=a%3Ab%7Bc%7D%25}"}},
		{Check{ClientID: "acme", User: "u:1", Resource: "/orders//42/?x=1", Cost: 1}, []string{"rl:orders:tb.1s:{user=u%3A1}:endpoint=/orders/42"}},
		{Check{ClientID: "acme", IP: "2001:DB8::1%eth0", Method: "post", Resource: "/ip", Cost: 1}, []string{"rl:by-ip:swc.10s:{ip=2001%3Adb8%3A%3A1}:method=POST"}},
		{Check{ClientID: "acme", IP: "::ffff:10.0.0.1", Method: "GET", Resource: "/ip", Cost: 1}, []string{"rl:by-ip:swc.10s:{ip=10.0.0.1}:method=GET"}},
		{Check{ClientID: "acme", Resource: "/all", Cost: 1}, []string{"rl:everyone:gcra.1s:{global}"}},
		{Check{ClientID: "acme", Resource: "/plan", Cost: 1}, []string{"rl:plans:tb.1m0s:{client=acme}"}},
		{Check{ClientID: "huge", Resource: "/plan", Cost: 1}, []string{"rl:plans:tb.24h0m0s.q100:{client=huge}"}},
		{Check{ClientID: "acme", APIKey: "k1", Resource: "/log", Cost: 1}, []string{"rl:log:swl.1h0m0s:{api_key=k1}"}},
		{Check{ClientID: "acme", Resource: "/leak", Cost: 1}, []string{"rl:leaky:lb.1m0s:{client=acme}"}},
		{Check{ClientID: "acme", Resource: "/world", Cost: 1}, []string{"rl:world:swc.1m0s:{client=acme}", "rl:world:@g:{client=acme}"}},
		{Check{ClientID: "acme", Resource: "/c/x", Cost: 1, IdempotencyKey: "order:7"}, []string{
			"rl:per-client:fw.1m0s:{client=acme}", "once rl:idem:{acme}:order%3A7:d699d71d90216394"}},
		{Check{ClientID: "acme", User: "u", Resource: long, Cost: 1}, []string{"rl:orders:tb.1s:{user=u}#31b8ff8c8221012a4e5481168f5973b0fbb009ab1c958cc1de74d415045bc2c4"}},
	} {
		if _, err := e.Check(ctx, &tt.check); err != nil {
			t.Fatalf("Check(%+v): %v", tt.check, err)
		}
		if got := log.take(); !slices.Equal(got, tt.want) {
			t.Errorf("Check(%+v) keys:\n got %q\nwant %q", tt.check, got, tt.want)
		}
	}

	if err := e.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := log.take(), []string{"rl:_ready"}; !slices.Equal(got, want) {
		t.Errorf("Ready keys: got %q, want %q", got, want)
	}
}

// TestBatchRepeatedKeys: a batch whose checks repeat a client's key in
// runs, and come back to it after others, decides each check on its own
// client's counter, as the same checks one at a time do.
func TestBatchRepeatedKeys(t *testing.T) {
	const pol = `
version: 1
rules:
  - {id: per-client, match: {resource: /r}, dimension: client, algorithm: fixed_window, limit: 1000, window: 1h}
`
	var checks []Check
	for i, run := range []int{5, 3, 2, 30, 1, 4} {
		for range run {
			checks = append(checks, Check{ClientID: "c" + string(rune('0'+i%3)), Resource: "/r", Cost: 1, Now: t0})
		}
	}
	for _, mode := range []BatchMode{AllOrNothing, BestEffort} {
		batched, _ := newEngine(t, pol)
		single, _ := newEngine(t, pol)
		got, err := batched.BatchCheck(context.Background(), checks, mode)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range checks {
			want := mustCheck(t, single, c)
			if got[i].Allowed != want.Allowed || got[i].Deciding.Remaining != want.Deciding.Remaining {
				t.Errorf("mode %d, check %d (%s): got allowed %v remaining %d, want %v %d",
					mode, i, c.ClientID, got[i].Allowed, got[i].Deciding.Remaining, want.Allowed, want.Deciding.Remaining)
			}
		}
	}
}
