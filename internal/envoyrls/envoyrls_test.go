package envoyrls

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/engine"
)

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
