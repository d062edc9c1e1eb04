package envoyrls

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// t0 is the start of a minute, so windows of a second or a minute begin at it.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// newStore returns a memory store, closed when the test ends.
func newStore(t testing.TB) engine.Store {
	t.Helper()
	s, err := memory.New(memory.Config{MaxKeys: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newEngine returns the Decider of an engine on the policy src, on a
// memory store at t0, and that store.
func newEngine(t testing.TB, src string) (*Decider, engine.Store) {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t)
	eng, err := engine.New(engine.Config{Store: st, Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	return NewDecider(eng, false), st
}

const envoyConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: path
    value: /shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: {name: specific, unit: minute, requests_per_unit: 1}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit:
          replaces: [{name: specific}]
          unit: minute
          requests_per_unit: 10
`

func descOf(kv ...string) Descriptor {
	var d Descriptor
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestShouldRateLimit(t *testing.T) {
	e, _ := newEngine(t, envoyConfig)
	ctx := context.Background()
	call := func(hits uint64, ds ...Descriptor) ([]DescriptorStatus, bool) {
		t.Helper()
		st, over, err := e.ShouldRateLimit(ctx, "edge", ds, hits)
		if err != nil {
			t.Fatal(err)
		}
		return st, over
	}
	// hits_addend 2 of 3, then 1, then over.
	st, over := call(2, descOf("remote_address", "10.0.0.1"))
	if over || !st[0].HasLimit || st[0].Limit != 3 || st[0].Unit != time.Minute || st[0].Remaining != 1 || st[0].DurationUntilReset <= 0 {
		t.Fatalf("first: got %+v over %v", st, over)
	}
	st, over = call(0, descOf("remote_address", "10.0.0.1"))
	if over || st[0].Remaining != 0 {
		t.Fatalf("second: got %+v over %v", st, over)
	}
	st, over = call(1, descOf("remote_address", "10.0.0.1"))
	if !over || !st[0].OverLimit {
		t.Fatalf("third: got %+v over %v, want over limit", st, over)
	}
	// Each value has its own counter.
	if _, over = call(1, descOf("remote_address", "10.0.0.2")); over {
		t.Errorf("another address is over limit")
	}
	// The value-specific entry wins: 0 per second blocks.
	if st, over = call(1, descOf("remote_address", "50.0.0.5")); !over || st[0].Limit != 0 {
		t.Errorf("blocked address: got %+v over %v", st, over)
	}
	// Unlimited, unknown and shadow descriptors.
	st, over = call(1, descOf("ldap", "x"), descOf("nothing", "x"), descOf("path", "/shadow"))
	if over || st[0].HasLimit || st[0].Remaining != math.MaxUint32 || st[1].HasLimit || !st[2].Shadow {
		t.Errorf("unlimited/unknown/shadow: got %+v over %v", st, over)
	}
	if st, over = call(1, descOf("path", "/shadow")); over || st[0].OverLimit {
		t.Errorf("shadow over its limit: got %+v over %v, want OK", st, over)
	}
	// replaces: with both descriptors, only the replacing limit (10) applies.
	for i := 0; i < 3; i++ {
		st, over = call(1, descOf("key_1", "value_1", "user", "bk"), descOf("key_2", "value_2", "user", "bk"))
		if over || st[0].HasLimit || st[1].Limit != 10 {
			t.Fatalf("replaces, call %d: got %+v over %v", i+1, st, over)
		}
	}
	// Over one descriptor, nothing consumed on the other.
	st, _ = call(1, descOf("remote_address", "10.0.0.9"))
	before := st[0].Remaining
	st, over = call(1, descOf("remote_address", "10.0.0.9"), descOf("remote_address", "50.0.0.5"))
	if !over || st[0].OverLimit {
		t.Errorf("mixed: got %+v over %v", st, over)
	}
	st, _ = call(1, descOf("remote_address", "10.0.0.9"))
	if st[0].Remaining != before-1 {
		t.Errorf("remaining after a denied request: got %d, want %d", st[0].Remaining, before-1)
	}
	// Unknown domain: OK without limits.
	if st, over, err := e.ShouldRateLimit(ctx, "nope", []Descriptor{descOf("a", "b")}, 1); err != nil || over || st[0].HasLimit {
		t.Errorf("unknown domain: got %+v %v %v", st, over, err)
	}
	// Bad input.
	for _, tc := range []struct {
		domain string
		ds     []Descriptor
		hits   uint64
		field  string
	}{
		{"", []Descriptor{descOf("a", "b")}, 1, "domain"},
		{"edge", nil, 1, "descriptors"},
		{"edge", []Descriptor{{}}, 1, "descriptors[0].entries"},
		{"edge", []Descriptor{descOf("", "b")}, 1, "descriptors[0].entries[0].key"},
		{"edge", []Descriptor{descOf("a", "b")}, math.MaxUint64, "hits_addend"},
		{"edge", []Descriptor{{Entries: descOf("a", "b").Entries, Limit: LimitOverride{Unit: time.Minute}}}, 1, "descriptors[0].limit.requests_per_unit"},
		{"edge", []Descriptor{{Entries: descOf("a", "b").Entries, Limit: LimitOverride{RequestsPerUnit: 1}}}, 1, "descriptors[0].limit.unit"},
	} {
		_, _, err := e.ShouldRateLimit(ctx, tc.domain, tc.ds, tc.hits)
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("ShouldRateLimit(%q, %v, %d): got %v, want a FieldError on %s", tc.domain, tc.ds, tc.hits, err, tc.field)
		}
	}
}

// TestShouldRateLimitDescriptorHits checks that a descriptor's own addend,
// when set, replaces the request's, and that a set 0 charges nothing.
func TestShouldRateLimitDescriptorHits(t *testing.T) {
	e, _ := newEngine(t, envoyConfig)
	ctx := context.Background()
	for i, tt := range []struct {
		set           bool
		descHits      uint64
		requestHits   uint64
		wantRemaining int64
	}{
		{true, 0, 2, 3},
		{true, 0, 0, 3},
		{true, 2, 0, 1},
		{false, 5, 0, 0}, // unset: its HitsAddend is ignored, the request's 0 means 1
		{true, 0, 1, 0},
	} {
		d := descOf("remote_address", "10.1.0.1")
		d.HitsAddend, d.HitsSet = tt.descHits, tt.set
		st, over, err := e.ShouldRateLimit(ctx, "edge", []Descriptor{d}, tt.requestHits)
		if err != nil {
			t.Fatal(err)
		}
		if over || st[0].Remaining != tt.wantRemaining {
			t.Errorf("call %d (%+v): got remaining %d over %v, want %d and not over", i+1, tt, st[0].Remaining, over, tt.wantRemaining)
		}
	}
}

func FuzzShouldRateLimit(f *testing.F) {
	f.Add("edge", "remote_address\x0010.0.0.1", uint64(1))
	f.Add("edge", "key_1\x00value_1\x01user\x00bk\x02key_2\x00value_2\x01user\x00bk", uint64(3))
	f.Add("edge", "ldap\x00\x02path\x00/shadow", uint64(0))
	f.Add("", "\x00", uint64(math.MaxUint64))
	e, _ := newEngine(f, envoyConfig)
	f.Fuzz(func(t *testing.T, domain, spec string, hits uint64) {
		// spec: descriptors separated by \x02, entries by \x01, key and
		// value by \x00.
		var ds []Descriptor
		for _, d := range strings.Split(spec, "\x02") {
			var desc Descriptor
			for _, en := range strings.Split(d, "\x01") {
				k, v, _ := strings.Cut(en, "\x00")
				desc.Entries = append(desc.Entries, DescriptorEntry{Key: k, Value: v})
			}
			ds = append(ds, desc)
		}
		st, _, err := e.ShouldRateLimit(context.Background(), domain, ds, hits)
		if err != nil {
			if !errors.Is(err, engine.ErrInvalidCheck) {
				t.Fatalf("error %v is not an invalid check", err)
			}
			return
		}
		if len(st) != len(ds) {
			t.Fatalf("%d statuses for %d descriptors", len(st), len(ds))
		}
	})
}

func TestShouldRateLimitExampleFile(t *testing.T) {
	p, err := policy.Load("../../examples/envoy-ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: newStore(t), Local: newStore(t), Policy: p, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	e := NewDecider(eng, false)
	ctx := context.Background()
	tests := []struct {
		d         Descriptor
		hits      uint64
		wantLimit int64
		wantOver  bool
	}{
		{descOf("message_type", "marketing", "to_number", "555"), 5, 5, false},
		{descOf("message_type", "marketing", "to_number", "555"), 1, 5, true},
		{descOf("message_type", "marketing", "to_number", "556"), 1, 5, false},
		{descOf("path", "/api/v1/a"), 600, 600, false},
		{descOf("path", "/api/v1/b"), 1, 600, false},
		{descOf("path", "/api/v1/a"), 1, 600, true},
		{descOf("remote_address", "50.0.0.5"), 1, 0, true},
		{descOf("category", "read", "user", "u"), 1, 100, false},
	}
	for i, tt := range tests {
		st, over, err := e.ShouldRateLimit(ctx, "edge", []Descriptor{tt.d}, tt.hits)
		if err != nil {
			t.Fatal(err)
		}
		if st[0].Limit != tt.wantLimit || over != tt.wantOver {
			t.Errorf("call %d %v x%d: got limit %d over %v, want %d %v", i+1, tt.d.Entries, tt.hits, st[0].Limit, over, tt.wantLimit, tt.wantOver)
		}
	}
}

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
	ds := []Descriptor{descOf("quota_a", "x"), descOf("quota_b", "x"), descOf("plain", "x")}
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
	read := descOf("plain", "x")
	read.HitsSet = true
	st, _, _ := e.ShouldRateLimit(ctx, "q", []Descriptor{read}, 0)
	if st[0].Remaining != 2 {
		t.Errorf("plain remaining after three requests: got %d, want 2", st[0].Remaining)
	}
}
