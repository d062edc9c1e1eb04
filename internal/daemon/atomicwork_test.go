package daemon_test

import (
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/daemon"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestAtomicBatchTooMuchWork: on Redis, an all_or_nothing batch of 1,000
// checks of distinct sliding window logs, which would hold Redis for about
// 100ms in one atomic call, is refused as bad input naming "checks": a 400
// over HTTP, InvalidArgument over gRPC, and nothing consumed. The same
// checks as best_effort are decided.
func TestAtomicBatchTooMuchWork(t *testing.T) {
	srv := redistest.Start(t)
	td := start(t, `version: 1
rules:
  - { id: log, match: { resource: /log }, dimension: user, algorithm: sliding_window_log, limit: 100, window: 1h }
`, func(c *daemon.Config) { c.StoreURL = "redis://" + srv.Addr })
	var checks []string
	var pb []*sluicev1.CheckRequest
	for i := range 1000 {
		checks = append(checks, `{"user":"u`+strconv.Itoa(i)+`","resource":"/log"}`)
		pb = append(pb, &sluicev1.CheckRequest{User: "u" + strconv.Itoa(i), Resource: "/log"})
	}
	body := func(mode string) string {
		return `{"client_id":"a","mode":"` + mode + `","checks":[` + strings.Join(checks, ",") + `]}`
	}
	r := post(t, td.base+"/api/v1/batch-check", body("all_or_nothing"))
	if r.status != 400 || r.str("field") != "checks" {
		t.Errorf("all_or_nothing batch of 1,000 distinct logs: %d %s, want 400 naming checks", r.status, r.raw)
	}
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	_, err := c.BatchCheck(ctx(t), &sluicev1.BatchCheckRequest{ClientId: "a", Mode: sluicev1.BatchMode_BATCH_MODE_ALL_OR_NOTHING, Checks: pb})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "checks") {
		t.Errorf("gRPC: %v, want InvalidArgument naming checks", err)
	}
	if rem := td.check(t, `{"client_id":"a","user":"u0","resource":"/log","cost":0}`).num("remaining"); rem != 100 {
		t.Errorf("remaining after the refused batches: %d, want 100", rem)
	}
	if r := post(t, td.base+"/api/v1/batch-check", body("best_effort")); r.status != 200 {
		t.Errorf("best_effort batch: %d %s, want 200", r.status, r.raw)
	}
}
