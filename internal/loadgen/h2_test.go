package loadgen

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// grpcFrame returns m in gRPC's length-prefixed framing.
func grpcFrame(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{0, 0, 0, 0, byte(len(b))}, b...)
}

func TestField1(t *testing.T) {
	for _, tt := range []struct {
		name string
		m    proto.Message
		want uint64
	}{
		{"over limit", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 7}}}, 2},
		{"ok", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, 1},
		{"allowed", &sluicev1.CheckResponse{Allowed: true, Limit: 10, Remaining: 9, Rule: "r"}, 1},
		{"denied", &sluicev1.CheckResponse{Limit: 10, Rule: "r"}, 0},
	} {
		got, err := field1(grpcFrame(t, tt.m))
		if err != nil || got != tt.want {
			t.Errorf("%s: field1 = %d, %v; want %d", tt.name, got, err, tt.want)
		}
	}
	for _, bad := range [][]byte{nil, {0, 0, 0}, {1, 0, 0, 0, 0}, {0, 0, 0, 0, 5, 8}, {0, 0, 0, 0, 1, 8}, {0, 0, 0, 0, 2, 0x0b, 1}} {
		if _, err := field1(bad); err == nil {
			t.Errorf("field1(%v): no error", bad)
		}
	}
}
