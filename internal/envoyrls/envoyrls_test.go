package envoyrls

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	s, err := New(eng, Config{})
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
		in   DescriptorStatus
		want *rlsv3.RateLimitResponse_DescriptorStatus
	}{
		{"unmatched", DescriptorStatus{}, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}},
		{"unlimited", DescriptorStatus{Remaining: 1<<32 - 1, Rule: "d.k"},
			&rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 1<<32 - 1}},
		{"per minute", DescriptorStatus{HasLimit: true, Limit: 5, Unit: time.Minute, Remaining: 4,
			DurationUntilReset: 1500 * time.Millisecond, Rule: "d.k"},
			&rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 4,
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "d.k", RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
				DurationUntilReset: durationpb.New(1500 * time.Millisecond)}},
		{"over, every 10 seconds", DescriptorStatus{OverLimit: true, HasLimit: true, Limit: 7, Unit: 10 * time.Second,
			DurationUntilReset: 3 * time.Second, Rule: "d.k_v"},
			&rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "d.k_v", RequestsPerUnit: 7, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND,
					UnitMultiplier: wrapperspb.UInt32(10)},
				DurationUntilReset: durationpb.New(3 * time.Second)}},
	} {
		if got := new(statusBlock).fill(&tt.in, Config{PreciseReset: true}); !proto.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestDescriptorLimitOverride checks that a descriptor's limit override
// replaces the configured limit, counted apart from it, and that a bad
// override is refused naming its field.
func TestDescriptorLimitOverride(t *testing.T) {
	s := newServer(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	ctx := context.Background()
	override := func(rpu uint32, unit typev3.RateLimitUnit, mult *wrapperspb.UInt32Value) *ratelimitv3.RateLimitDescriptor_RateLimitOverride {
		return &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit, UnitMultiplier: mult}
	}
	request := func(domain, key string, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "v"}},
			Limit:   o,
		}}}
	}
	perMinute := &rlsv3.RateLimitResponse_RateLimit{Name: "d.limit_override", RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	for _, tt := range []struct {
		name          string
		req           *rlsv3.RateLimitRequest
		wantOver      bool
		wantLimit     *rlsv3.RateLimitResponse_RateLimit
		wantRemaining uint32
	}{
		{"1 per minute", request("d", "k", override(1, typev3.RateLimitUnit_MINUTE, nil)), false, perMinute, 0},
		{"1 per minute, again", request("d", "k", override(1, typev3.RateLimitUnit_MINUTE, nil)), true, perMinute, 0},
		{"the configured limit, counted apart", request("d", "k", nil), false,
			&rlsv3.RateLimitResponse_RateLimit{Name: "d.k", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}, 9},
		{"a descriptor the configuration does not limit", request("d", "other", override(1, typev3.RateLimitUnit_MINUTE, nil)), false, perMinute, 0},
		{"every 30 seconds", request("d", "k30", override(5, typev3.RateLimitUnit_SECOND, wrapperspb.UInt32(30))), false,
			&rlsv3.RateLimitResponse_RateLimit{Name: "d.limit_override", RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND,
				UnitMultiplier: wrapperspb.UInt32(30)}, 4},
		{"a domain the policy does not hold", request("nope", "k", override(1, typev3.RateLimitUnit_MINUTE, nil)), false, nil, 0},
	} {
		resp, err := s.ShouldRateLimit(ctx, tt.req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		st := resp.Statuses[0]
		if got := resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT; got != tt.wantOver {
			t.Errorf("%s: over limit %v, want %v", tt.name, got, tt.wantOver)
		}
		if !proto.Equal(st.CurrentLimit, tt.wantLimit) {
			t.Errorf("%s: current_limit %v, want %v", tt.name, st.CurrentLimit, tt.wantLimit)
		}
		if st.LimitRemaining != tt.wantRemaining {
			t.Errorf("%s: limit_remaining %d, want %d", tt.name, st.LimitRemaining, tt.wantRemaining)
		}
	}

	for _, tt := range []struct {
		name      string
		o         *ratelimitv3.RateLimitDescriptor_RateLimitOverride
		wantField string
	}{
		{"no requests", override(0, typev3.RateLimitUnit_MINUTE, nil), "descriptors[0].limit.requests_per_unit"},
		{"no unit", override(1, typev3.RateLimitUnit_UNKNOWN, nil), "descriptors[0].limit.unit:"},
		{"an unknown unit", override(1, typev3.RateLimitUnit(42), nil), "descriptors[0].limit.unit:"},
		{"a multiplier of 0", override(1, typev3.RateLimitUnit_SECOND, wrapperspb.UInt32(0)), "descriptors[0].limit.unit_multiplier"},
		{"longer than a year", override(1, typev3.RateLimitUnit_YEAR, wrapperspb.UInt32(2)), "descriptors[0].limit.unit_multiplier"},
		{"too many to count exactly", override(1<<32-1, typev3.RateLimitUnit_YEAR, nil), "descriptors[0].limit"},
	} {
		_, err := s.ShouldRateLimit(ctx, request("d", "k", tt.o))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.wantField) {
			t.Errorf("%s: got %v, want InvalidArgument naming %s", tt.name, err, tt.wantField)
		}
	}
}
