// Command noop is the reference server of the load runs in
// docs/PERFORMANCE.md (cd bench; go run ./cmd/noop):
// a server that speaks Sluice's three APIs (HTTP POST /api/v1/check, gRPC
// CheckRateLimit, Envoy's ShouldRateLimit) and allows every request
// without deciding anything. sluice-load against it measures the floor
// that the transports and the load generator set on this machine; the
// ratio of Sluice's figures to it is what deciding costs.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

type envoy struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (envoy) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

type limiter struct {
	sluicev1.UnimplementedRateLimiterServer
}

func (limiter) CheckRateLimit(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	return &sluicev1.CheckResponse{Allowed: true}, nil
}

func main() {
	httpAddr := flag.String("http-addr", "127.0.0.1:8080", "HTTP listen address")
	grpcAddr := flag.String("grpc-addr", "127.0.0.1:8081", "gRPC listen address")
	flag.Parse()
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400) // as sluice serve and sluice-load do
	}
	http.HandleFunc("POST /api/v1/check", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"allowed":true}`))
	})
	ln, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		log.Fatal(err)
	}
	// The transport settings of sluice serve (internal/daemon), so that
	// the ratio to this server is what deciding costs, not tuning.
	g := grpc.NewServer(grpc.NumStreamWorkers(uint32(max(128, 32*runtime.GOMAXPROCS(0)))),
		grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(1<<20))
	rlsv3.RegisterRateLimitServiceServer(g, envoy{})
	sluicev1.RegisterRateLimiterServer(g, limiter{})
	go g.Serve(ln)
	log.Fatal(http.ListenAndServe(*httpAddr, nil))
}
