package envoyrls

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// newServer returns a service deciding the policy yaml on a memory store.
func newServer(t *testing.T, yaml string) *Server {
	t.Helper()
	p, err := policy.Parse("policy.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	st, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(eng)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDescriptorHitsAddendZeroReads checks that a descriptor whose
// hits_addend is set to 0 is decided without being charged, whatever the
// request's hits_addend, as in Envoy's API.
func TestDescriptorHitsAddendZeroReads(t *testing.T) {
	s := newServer(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	ctx := context.Background()
	for _, tt := range []struct {
		name          string
		requestHits   uint32
		descHits      *wrapperspb.UInt64Value
		wantRemaining uint32
		wantOver      bool
	}{
		{"read", 0, wrapperspb.UInt64(0), 2, false},
		{"read again", 0, wrapperspb.UInt64(0), 2, false},
		{"read, the request's addend 5", 5, wrapperspb.UInt64(0), 2, false},
		{"the descriptor's addend 2 over the request's 5", 5, wrapperspb.UInt64(2), 0, false},
		{"read when exhausted", 0, wrapperspb.UInt64(0), 0, false},
		{"unset: the request's addend 0 means 1", 0, nil, 0, true},
	} {
		req := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: tt.requestHits, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}},
			HitsAddend: tt.descHits,
		}}}
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := resp.Statuses[0].LimitRemaining; got != tt.wantRemaining {
			t.Errorf("%s: limit_remaining %d, want %d", tt.name, got, tt.wantRemaining)
		}
		if got := resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT; got != tt.wantOver {
			t.Errorf("%s: over limit %v, want %v", tt.name, got, tt.wantOver)
		}
	}
}

// TestStatusBlock compares the descriptor statuses built in one allocation
// with the same messages built field by field.
func TestStatusBlock(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   engine.DescriptorStatus
		want *rlsv3.RateLimitResponse_DescriptorStatus
	}{
		{"unmatched", engine.DescriptorStatus{}, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}},
		{"unlimited", engine.DescriptorStatus{Remaining: 1<<32 - 1, Rule: "d.k"},
			&rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 1<<32 - 1}},
		{"per minute", engine.DescriptorStatus{HasLimit: true, Limit: 5, Unit: time.Minute, Remaining: 4,
			DurationUntilReset: 1500 * time.Millisecond, Rule: "d.k"},
			&rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 4,
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "d.k", RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
				DurationUntilReset: durationpb.New(1500 * time.Millisecond)}},
		{"over, every 10 seconds", engine.DescriptorStatus{OverLimit: true, HasLimit: true, Limit: 7, Unit: 10 * time.Second,
			DurationUntilReset: 3 * time.Second, Rule: "d.k_v"},
			&rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "d.k_v", RequestsPerUnit: 7, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND,
					UnitMultiplier: wrapperspb.UInt32(10)},
				DurationUntilReset: durationpb.New(3 * time.Second)}},
	} {
		if got := new(statusBlock).fill(&tt.in); !proto.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}
