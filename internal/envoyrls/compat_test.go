package envoyrls

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

const compatPolicy = `domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: big
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: zero
    rate_limit: { unit: minute, requests_per_unit: 0 }
`

// stores returns the stores the compatibility tests run on: memory, and
// a real Redis.
func stores(t *testing.T) map[string]func(t *testing.T) engine.Store {
	return map[string]func(t *testing.T) engine.Store{
		"memory": func(t *testing.T) engine.Store {
			st, err := memory.New(memory.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		"redis": func(t *testing.T) engine.Store {
			srv := redistest.Start(t)
			st, err := redis.New(redis.Config{Addrs: []string{srv.Addr}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
	}
}

// compatServer returns a service deciding compatPolicy on st, with compat
// set in the engine and the service alike.
func compatServer(t *testing.T, st engine.Store, compat bool) *Server {
	t.Helper()
	p, err := policy.Parse("policy.yaml", []byte(compatPolicy))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(eng, Config{Compat: compat})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// desc returns a descriptor of one entry; hits, when not negative, is its
// own hits_addend.
func desc(key, value string, hits int64) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
	if hits >= 0 {
		d.HitsAddend = wrapperspb.UInt64(uint64(hits))
	}
	return d
}

func ask(t *testing.T, s *Server, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func codesOf(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	var out []rlsv3.RateLimitResponse_Code
	for _, st := range resp.Statuses {
		out = append(out, st.Code)
	}
	return out
}

// TestEnvoyDurationUntilResetWholeSeconds checks that duration_until_reset
// is reported in whole seconds, rounded up as envoyproxy/ratelimit's
// (unit - now % unit, in Unix seconds), unless PreciseReset asks for the
// store's figure.
func TestEnvoyDurationUntilResetWholeSeconds(t *testing.T) {
	for _, tt := range []struct{ in, want time.Duration }{
		{1500 * time.Millisecond, 2 * time.Second},
		{3 * time.Second, 3 * time.Second},
		{time.Microsecond, time.Second},
		{59*time.Second + 999999*time.Microsecond, time.Minute},
	} {
		in := DescriptorStatus{HasLimit: true, Limit: 2, Unit: time.Minute, DurationUntilReset: tt.in}
		if got := new(statusBlock).fill(&in, Config{}).DurationUntilReset.AsDuration(); got != tt.want {
			t.Errorf("%v: got %v, want %v", tt.in, got, tt.want)
		}
		if got := new(statusBlock).fill(&in, Config{PreciseReset: true}).DurationUntilReset.AsDuration(); got != tt.in {
			t.Errorf("%v, precise: got %v", tt.in, got)
		}
	}
	s := compatServer(t, stores(t)["memory"](t), false)
	before := time.Now().Unix()
	resp := ask(t, s, desc("k", "a", -1))
	after := time.Now().Unix()
	d := resp.Statuses[0].DurationUntilReset
	// envoyproxy/ratelimit's figure at any Unix second of the call.
	if d.Nanos != 0 || d.Seconds != 60-before%60 && d.Seconds != 60-after%60 {
		t.Errorf("duration_until_reset %v, want %ds or %ds", d.AsDuration(), 60-before%60, 60-after%60)
	}
}

// TestEnvoyCompatEmptyDescriptor checks that a descriptor with no entries
// is refused with InvalidArgument, and with Compat answers OK with no
// limit, as envoyproxy/ratelimit does, the others decided as usual.
func TestEnvoyCompatEmptyDescriptor(t *testing.T) {
	empty := &ratelimitv3.RateLimitDescriptor{}
	_, err := compatServer(t, stores(t)["memory"](t), false).ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{empty}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("default: got %v, want InvalidArgument", err)
	}
	s := compatServer(t, stores(t)["memory"](t), true)
	resp := ask(t, s, empty, desc("k", "a", -1))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[0].LimitRemaining != 0 ||
		resp.Statuses[1].LimitRemaining != 1 {
		t.Errorf("compat: got %v, want OK with no limit, and the other descriptor counted", resp)
	}
}

// TestEnvoyCompatRemainingZeroOverLimit checks limit_remaining on
// OVER_LIMIT: the true remaining by default, 0 with Compat.
func TestEnvoyCompatRemainingZeroOverLimit(t *testing.T) {
	for _, compat := range []bool{false, true} {
		s := compatServer(t, stores(t)["memory"](t), compat)
		ask(t, s, desc("big", "a", 3))
		resp := ask(t, s, desc("big", "a", 3)) // 3 asked, 2 remain
		want := uint32(2)
		if compat {
			want = 0
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != want {
			t.Errorf("compat %v: got %v, want OVER_LIMIT with limit_remaining %d", compat, resp, want)
		}
	}
}

// TestEnvoyCompatRefusedHitsCounted checks, on memory and on a real Redis,
// that refused hits are not counted by default (a later check-only
// descriptor is OK, and a request over one limit consumes nothing on the
// others), and are with Compat, as envoyproxy/ratelimit counts them (the
// window stays over its limit, and the other descriptors are charged).
func TestEnvoyCompatRefusedHitsCounted(t *testing.T) {
	for name, newStore := range stores(t) {
		for _, compat := range []bool{false, true} {
			s := compatServer(t, newStore(t), compat)
			ask(t, s, desc("k", "a", -1))
			ask(t, s, desc("k", "a", -1))
			over := ask(t, s, desc("k", "a", -1), desc("big", "a", -1)) // over k
			if got := codesOf(over); got[0] != rlsv3.RateLimitResponse_OVER_LIMIT || got[1] != rlsv3.RateLimitResponse_OK {
				t.Errorf("%s compat %v: third request %v, want OVER_LIMIT then OK", name, compat, got)
			}
			read := ask(t, s, desc("k", "a", 0), desc("big", "a", 0))
			wantCode, wantBig := rlsv3.RateLimitResponse_OK, uint32(5)
			if compat {
				wantCode, wantBig = rlsv3.RateLimitResponse_OVER_LIMIT, 4
			}
			if read.Statuses[0].Code != wantCode || read.Statuses[1].LimitRemaining != wantBig {
				t.Errorf("%s compat %v: check-only after a refused hit: %v, want %v and %d remaining on the other", name, compat, read, wantCode, wantBig)
			}
		}
	}
}

// TestEnvoyCompatZeroHitsAgainstZeroLimit checks a check-only descriptor
// (hits_addend 0) under requests_per_unit 0: OVER_LIMIT by default; with
// Compat OK, as envoyproxy/ratelimit answers while no hit was counted in
// the window, and OVER_LIMIT once one was.
func TestEnvoyCompatZeroHitsAgainstZeroLimit(t *testing.T) {
	for name, newStore := range stores(t) {
		for _, compat := range []bool{false, true} {
			s := compatServer(t, newStore(t), compat)
			want := rlsv3.RateLimitResponse_OVER_LIMIT
			if compat {
				want = rlsv3.RateLimitResponse_OK
			}
			if got := ask(t, s, desc("zero", "a", 0)); got.OverallCode != want {
				t.Errorf("%s compat %v: check-only under 0: %v, want %v", name, compat, got, want)
			}
			if got := ask(t, s, desc("zero", "a", -1)); got.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("%s compat %v: a hit under 0: %v, want OVER_LIMIT", name, compat, got)
			}
			if got := ask(t, s, desc("zero", "a", 0)); got.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("%s compat %v: check-only after a hit: %v, want OVER_LIMIT", name, compat, got)
			}
		}
	}
}
