package daemon_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/daemon"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// benchPolicy admits far more than a benchmark sends, so that every check
// goes to the store and is allowed.
const benchPolicy = `version: 1
rules:
  - id: per-client
    match: { resource: "/api/*" }
    dimension: client
    algorithm: fixed_window
    limit: 1000000000
    window: 1m
envoy:
  - domain: load
    descriptors:
      - key: client_id
        rate_limit: { unit: minute, requests_per_unit: 1000000000 }
`

// realClock makes a test daemon use the real clock.
func realClock(c *daemon.Config) { c.Now = nil }

// The end-to-end benchmarks run client and server in one process over
// loopback, 64 concurrent callers on 1000 keys: ns/op is the CPU of both
// sides per check, divided by the cores.

func BenchmarkEnvoyShouldRateLimit(b *testing.B) {
	td := start(b, benchPolicy, realClock)
	conn, err := grpc.NewClient(td.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	var n atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			k := "k" + strconv.Itoa(int(n.Add(1)%1000))
			resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "load", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client_id", Value: k}}}}})
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Fatal(resp, err)
			}
		}
	})
}

func BenchmarkGRPCCheck(b *testing.B) {
	td := start(b, benchPolicy, realClock)
	conn, err := grpc.NewClient(td.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := sluicev1.NewRateLimiterClient(conn)
	var n atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			k := "k" + strconv.Itoa(int(n.Add(1)%1000))
			resp, err := c.CheckRateLimit(ctx, &sluicev1.CheckRequest{ClientId: k, Resource: "/api/x"})
			if err != nil || !resp.GetAllowed() {
				b.Fatal(resp, err)
			}
		}
	})
}

func BenchmarkHTTPCheck(b *testing.B) {
	td := start(b, benchPolicy, realClock)
	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	var n atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := `{"client_id":"k` + strconv.Itoa(int(n.Add(1)%1000)) + `","resource":"/api/x"}`
			resp, err := client.Post(td.base+"/api/v1/check", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatal(resp.Status)
			}
		}
	})
}
