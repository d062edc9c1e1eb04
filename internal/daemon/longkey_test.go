package daemon_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/policy"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestLongKeysOverEveryAPI sends, over HTTP, gRPC and Envoy's API, checks
// whose store keys are KiB long once escaped (a resource of 2,000 ':', a
// descriptor value of 512): each is counted on its own key, denied at its
// limit by Redis, then from the over-limit cache, and the key it counts on
// (shown in an Envoy denial's event) is shortened to at most
// policy.MaxKeyBytes. Input over the APIs' length bounds is refused with
// an error naming the field.
func TestLongKeysOverEveryAPI(t *testing.T) {
	srv := redistest.Start(t)
	td := start(t, `version: 1
defaults: { algorithm: fixed_window }
rules:
  - { id: per-path, match: { resource: "/long/*" }, dimension: client+endpoint, limit: 2, window: 1m }
envoy:
  - domain: edge
    descriptors:
      - { key: path, rate_limit: { unit: minute, requests_per_unit: 2 } }
`, func(c *daemon.Config) {
		c.StoreURL = "redis://" + srv.Addr
		c.Guard = guard.Config{Deadline: 5 * time.Second} // a busy machine is no store failure
	})
	res := "/long/" + strings.Repeat(":", 2000)
	want := []string{"200 store", "200 store", "429 store", "429 over_limit_cache"}

	// HTTP.
	for i, w := range want {
		r := td.check(t, `{"client_id":"h","resource":"`+res+`"}`)
		if got := fmt.Sprintf("%d %s", r.status, r.str("source")); got != w {
			t.Errorf("HTTP check %d of a long resource: %s, want %s", i+1, got, w)
		}
	}
	if r := td.check(t, `{"client_id":"h","resource":"`+res+`x"}`); r.status != 200 {
		t.Errorf("HTTP: another long resource: %d %s, want 200 (counted apart)", r.status, r.raw)
	}
	if r := td.check(t, `{"client_id":"h","resource":"/`+strings.Repeat("r", 2048)+`"}`); r.status != 400 || r.str("field") != "resource" {
		t.Errorf("HTTP: a resource of 2049 bytes: %d %s, want 400 naming resource", r.status, r.raw)
	}

	// gRPC.
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	for i, w := range want {
		resp, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "g", Resource: res})
		if err != nil {
			t.Fatal(err)
		}
		code := "200"
		if !resp.GetAllowed() {
			code = "429"
		}
		if got := code + " " + resp.GetSource(); got != w {
			t.Errorf("gRPC check %d of a long resource: %s, want %s", i+1, got, w)
		}
	}
	_, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "g", Resource: "/" + strings.Repeat("r", 2048)})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "resource:") {
		t.Errorf("gRPC: a resource of 2049 bytes: %v, want InvalidArgument naming resource", err)
	}

	// Envoy.
	e := rlsv3.NewRateLimitServiceClient(dial(t, td.GRPCAddr()))
	value := strings.Repeat(":", 60<<10) // a header value as long as Envoy's default limit allows
	for i, w := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK,
		rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := e.ShouldRateLimit(ctx(t), envoyReq("edge", 1, []string{"path", value}))
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != w {
			t.Errorf("Envoy call %d with a long descriptor: %v, want %v", i+1, resp.GetOverallCode(), w)
		}
	}
	resp, err := e.ShouldRateLimit(ctx(t), envoyReq("edge", 1, []string{"path", value[1:] + "x"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("Envoy: another long descriptor: %v %v, want OK (counted apart)", resp.GetOverallCode(), err)
	}
	_, err = e.ShouldRateLimit(ctx(t), envoyReq("edge", 1, []string{"path", strings.Repeat(":", 64<<10+1)}))
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "descriptors[0].entries[0].value is 65537 bytes long, the limit is 65536") {
		t.Errorf("Envoy: a value of 64 KiB and a byte: %v, want InvalidArgument naming the value", err)
	}

	// The denials' events show the key an Envoy descriptor counts on.
	r := get(t, td.base+"/api/v1/events?type=rate_limit_exceeded")
	keys := 0
	for _, ev := range r.body["events"].([]any) {
		k, _ := ev.(map[string]any)["key"].(string)
		if k == "" {
			continue
		}
		keys++
		if len(k) > policy.MaxKeyBytes || !strings.HasPrefix(k, "rl:envoy:edge:") || !strings.Contains(k, "}#") {
			t.Errorf("event of an Envoy denial: key %q (%d bytes), want a shortened key of at most %d", k, len(k), policy.MaxKeyBytes)
		}
	}
	if keys == 0 {
		t.Errorf("no event of an Envoy denial shows its key: %s", r.raw)
	}
}
