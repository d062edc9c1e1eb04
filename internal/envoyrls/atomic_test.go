package envoyrls

import (
	"context"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestAtomicWorkSplitsDescriptors: an Envoy request of 64 descriptors on
// distinct sliding window logs takes more store work than one atomic
// call may (store.Info.MaxAtomicWork), so it is decided descriptor by
// descriptor, in calls the store bounds, rather than refused: each
// descriptor is admitted once an hour, exactly.
func TestAtomicWorkSplitsDescriptors(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	local, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("bound.yaml", []byte(`
version: 1
envoy:
  - domain: edge
    descriptors:
      - key: tenant
        rate_limit: { unit: hour, requests_per_unit: 1, algorithm: sliding_window_log }
`))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, Local: local, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecider(eng, false)
	scriptCalls := func() int64 { _, c := srv.ScriptStats(t); return c }
	descs := make([]Descriptor, 64)
	for i := range descs {
		descs[i] = Descriptor{Entries: []DescriptorEntry{{Key: "tenant", Value: "t" + strconv.Itoa(i)}}}
	}
	for round, want := range []bool{false, true} {
		calls0 := scriptCalls()
		sts, over, err := d.ShouldRateLimit(context.Background(), "edge", descs, 1)
		if err != nil {
			t.Fatal(err)
		}
		calls := scriptCalls()
		if over != want || len(sts) != len(descs) {
			t.Fatalf("round %d: over limit %v, want %v", round, over, want)
		}
		for i, s := range sts {
			if s.OverLimit != want {
				t.Fatalf("round %d: descriptor %d over limit %v, want %v", round, i, s.OverLimit, want)
			}
		}
		if calls-calls0 < 2 {
			t.Errorf("round %d: %d script calls, want the descriptors split", round, calls-calls0)
		}
	}
}

// BenchmarkBulkEnvoy is the work in process of an Envoy request of 64
// descriptors of one key, over its limit, which one client can send back
// to back (the engine's BenchmarkBulkRequests is the same for a batch of
// checks): the fewer bytes it allocates, the fewer garbage collections it
// causes, which slow every other check of the process.
func BenchmarkBulkEnvoy(b *testing.B) {
	d, _ := newEngine(b, `
domain: edge
descriptors:
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 64 }
`)
	ctx := context.Background()
	descs := make([]Descriptor, 64)
	for i := range descs {
		descs[i] = Descriptor{Entries: []DescriptorEntry{{Key: "tenant", Value: "attacker"}}}
	}
	b.Run("allocated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := d.ShouldRateLimit(ctx, "edge", descs, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The gRPC service's: the answer reused.
	b.Run("reused", func(b *testing.B) {
		b.ReportAllocs()
		var a Answer
		for b.Loop() {
			if err := d.ShouldRateLimitInto(ctx, "edge", descs, 1, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestShouldRateLimitIntoReused: an answer reused from request to request
// holds what ShouldRateLimit returns, on an engine of its own with the same
// history, for requests of many descriptors and of few, matched or not,
// over the limit or not, and bad ones.
func TestShouldRateLimitIntoReused(t *testing.T) {
	const pol = `
domain: edge
descriptors:
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 8 }
  - key: free
    rate_limit: { unlimited: true }
`
	alloc, _ := newEngine(t, pol)
	reused, _ := newEngine(t, pol)
	descs := func(n int, key, value string) []Descriptor {
		ds := make([]Descriptor, n)
		for i := range ds {
			ds[i] = Descriptor{Entries: []DescriptorEntry{{Key: key, Value: value + strconv.Itoa(i%3)}}}
		}
		return ds
	}
	mixed := append(descs(6, "tenant", "m"), descs(3, "free", "f")...)
	mixed = append(mixed, descs(2, "nomatch", "n")...)
	ctx := context.Background()
	var a Answer
	for i, ds := range [][]Descriptor{descs(20, "tenant", "a"), descs(2, "tenant", "b"), mixed, descs(30, "tenant", "a"),
		{{Entries: []DescriptorEntry{{Key: "", Value: "x"}}}}, descs(12, "free", "f"), mixed} {
		want, wantOver, wantErr := alloc.ShouldRateLimit(ctx, "edge", ds, 1)
		err := reused.ShouldRateLimitInto(ctx, "edge", ds, 1, &a)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("request %d: error %v, want %v", i, err, wantErr)
		}
		if err != nil {
			if len(a.Statuses) != 0 {
				t.Errorf("request %d: %d statuses with an error, want none", i, len(a.Statuses))
			}
			continue
		}
		// The engines read the clock each: their resets differ by the
		// time between the two calls.
		got := slices.Clone(a.Statuses)
		for j := range got {
			if j < len(want) && (got[j].DurationUntilReset-want[j].DurationUntilReset).Abs() < time.Second {
				got[j].DurationUntilReset = want[j].DurationUntilReset
			}
		}
		if a.OverLimit != wantOver || !reflect.DeepEqual(got, want) {
			t.Errorf("request %d: over %v, %+v\nwant over %v, %+v", i, a.OverLimit, got, wantOver, want)
		}
	}
}
