package loadgen

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
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

// stalledServer listens on a loopback port for HTTP/2 connections that it
// answers with its SETTINGS (settings) and then reads without ever
// granting window or answering a call: a server that has stopped making
// progress. It returns the server's address.
func stalledServer(t *testing.T, settings ...http2.Setting) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { nc.Close() })
			go func() {
				preface := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(nc, preface); err != nil {
					return
				}
				fr := http2.NewFramer(nc, nc)
				fr.SetMaxReadFrameSize(1 << 24)
				fr.WriteSettings(settings...)
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
						fr.WriteSettingsAck()
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestH2WindowWaitTimesOut runs against a server that stops granting
// window once its first 64 KiB are spent: a request that waits for window
// fails when its timeout expires, counted as an error, and the run ends on
// time, in a closed loop and at a fixed rate.
func TestH2WindowWaitTimesOut(t *testing.T) {
	addr := stalledServer(t)
	for _, rate := range []float64{0, 200} {
		done := make(chan *Report, 1)
		began := time.Now()
		go func() {
			// 8 KB requests: the first eight spend the window.
			rep, err := Run(context.Background(), Config{Target: TargetGRPC, Addr: addr, Rate: rate, Concurrency: 4,
				Duration: time.Second, Timeout: 100 * time.Millisecond, Conns: 1,
				Resource: "/" + strings.Repeat("r", 8000)})
			if err != nil {
				t.Error(err)
			}
			done <- rep
		}()
		select {
		case rep := <-done:
			if took := time.Since(began); took > 3*time.Second {
				t.Errorf("rate %v: a 1s run took %s", rate, took)
			}
			// 4 callers for 1s with a timeout of 100ms: about 40 timeouts.
			if rep.Errors < 20 || rep.Allowed+rep.Denied != 0 {
				t.Errorf("rate %v: %d allowed, %d denied, %d errors; want only errors, at least 20", rate, rep.Allowed, rep.Denied, rep.Errors)
			}
			for _, m := range rep.ErrorSamples {
				if m != context.DeadlineExceeded.Error() {
					t.Errorf("rate %v: error %q, want only %q", rate, m, context.DeadlineExceeded)
				}
			}
		case <-time.After(6 * time.Second):
			t.Fatalf("rate %v: a 1s run is still going after 6s", rate)
		}
	}
}

// TestH2RequestOverWindow: a request larger than the server's stream
// window fails at once; one within it but larger than the connection
// window, with nothing in flight that could earn more, fails at its
// timeout. Both errors name the window, and each caller stops.
func TestH2RequestOverWindow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		setting  http2.Setting
		resource int
		callers  int
		want     string
	}{
		{"stream", http2.Setting{ID: http2.SettingInitialWindowSize, Val: 4096}, 8000, 2, "larger than the server's stream window of 4096 bytes"},
		{"connection", http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}, 70000, 1, "larger than the server's connection window of 65535 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := stalledServer(t, tc.setting)
			rep, err := Run(context.Background(), Config{Target: TargetGRPC, Addr: addr, Concurrency: tc.callers, Conns: 1,
				Duration: 5 * time.Second, Timeout: 100 * time.Millisecond, Resource: "/" + strings.Repeat("r", tc.resource)})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Errors != int64(tc.callers) || rep.Elapsed > 1 {
				t.Errorf("%d errors in %.2fs, want %d and the run to end at once", rep.Errors, rep.Elapsed, tc.callers)
			}
			for _, m := range rep.ErrorSamples {
				if !strings.Contains(m, tc.want) {
					t.Errorf("error %q, want it to say %q", m, tc.want)
				}
			}
		})
	}
}

// TestNoLatencyWithoutAnswers runs against a server that answers nothing:
// every request times out, and the report gives no latency figures.
func TestNoLatencyWithoutAnswers(t *testing.T) {
	addr := stalledServer(t)
	rep, err := Run(context.Background(), Config{Target: TargetGRPC, Addr: addr, Concurrency: 2, Conns: 1,
		Duration: 700 * time.Millisecond, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors == 0 || rep.Allowed+rep.Denied != 0 {
		t.Fatalf("%d allowed, %d denied, %d errors; want only errors", rep.Allowed, rep.Denied, rep.Errors)
	}
	if rep.Latency != nil {
		t.Errorf("latency %+v, want none: no request was answered", *rep.Latency)
	}
	var b strings.Builder
	rep.Text(&b)
	if strings.Contains(b.String(), "p50") || !strings.Contains(b.String(), "no request answered") {
		t.Errorf("text report:\n%s\nwant no percentiles, and to say that no request was answered", b.String())
	}
}
