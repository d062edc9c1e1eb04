package daemon_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/events"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// serverCloses reports whether the server closes conn (or answers and
// closes it) within d, reading whatever it sends meanwhile.
func serverCloses(conn net.Conn, d time.Duration) (bool, string) {
	conn.SetReadDeadline(time.Now().Add(d))
	got, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, string(got)
	}
	return true, string(got)
}

// shortHTTPTimeouts gives the HTTP API a read timeout of 1s and a write
// timeout of 2s, so that the tests of what they cut off wait less.
func shortHTTPTimeouts(c *daemon.Config) {
	c.HTTPReadTimeout, c.HTTPWriteTimeout = time.Second, 2*time.Second
}

// TestSlowRequestBodyIsCutOff sends a request's headers and part of its
// body, then nothing: the server must not wait for the rest forever, each
// such connection holding a goroutine and its buffers.
func TestSlowRequestBodyIsCutOff(t *testing.T) {
	t.Parallel()
	td := start(t, policyText(), shortHTTPTimeouts)
	conn, err := net.Dial("tcp", td.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"client_id":"slow","resource":"/api/limited"}`
	if _, err := io.WriteString(conn, "POST /api/v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"+
		"Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body[:10]); err != nil {
		t.Fatal(err)
	}
	closed, got := serverCloses(conn, 10*time.Second)
	if !closed {
		t.Fatalf("the connection of a request whose body stopped coming is still open after 10s, with a read timeout of 1s (read %q)", got)
	}
	if !strings.HasPrefix(got, "HTTP/1.1 400") {
		t.Errorf("answer to a body that stopped coming: %q, want a 400", got)
	}
	// The check was not decided: nothing was consumed.
	if rem := td.remaining(t, "slow", "/api/limited", "per-client"); rem != 3 {
		t.Errorf("remaining after a cut-off request: %d, want 3", rem)
	}
}

// TestClientThatDoesNotReadIsCutOff pipelines requests and never reads the
// answers: once the socket buffers are full the server's writes block, and
// must not block forever.
func TestClientThatDoesNotReadIsCutOff(t *testing.T) {
	t.Parallel()
	td := start(t, policyText(), shortHTTPTimeouts)
	conn, err := net.Dial("tcp", td.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// /metrics answers kilobytes: a few thousand answers fill the buffers
	// of both ends.
	wrote := make(chan error, 1)
	go func() {
		w := bufio.NewWriter(conn)
		for range 4000 {
			if _, err := w.WriteString("GET /metrics HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- w.Flush()
	}()
	// The server's writes block within a second or two, even under load,
	// and it gives up 2s later.
	const wait = 8 * time.Second
	time.Sleep(wait)
	// Reading now drains what the server wrote: when it has given up on
	// the connection the read ends (EOF or a reset); when it is still
	// blocked it resumes, answers the rest, and waits for more requests.
	if closed, _ := serverCloses(conn, 5*time.Second); !closed {
		t.Errorf("a client that reads no answer still holds its connection after %s", wait)
	}
	<-wrote
	if r := get(t, td.base+"/healthz"); r.status != http.StatusOK {
		t.Errorf("healthz: %d", r.status)
	}
}

// TestGRPCStreamsPerConnectionBounded opens many calls on one HTTP/2
// connection, each sending its headers and never its message: every one
// holds a handler until the read timeout, so the server must bound how
// many one connection may open, and refuse the others.
func TestGRPCStreamsPerConnectionBounded(t *testing.T) {
	td := start(t, policyText())
	conn, err := net.Dial("tcp", td.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "sluice"},
		{":path", "/sluice.v1.RateLimiter/CheckRateLimit"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	const streams = 3000
	var wmu sync.Mutex // the framer's writes
	write := make(chan error, 1)
	go func() {
		for i := range streams {
			wmu.Lock()
			err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true})
			wmu.Unlock()
			if err != nil {
				write <- err
				return
			}
		}
		write <- nil
	}()
	var maxStreams uint32
	refused := 0
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for maxStreams == 0 || refused < streams-int(maxStreams) {
		f, err := fr.ReadFrame()
		if err != nil {
			break // the deadline: the server sends nothing more
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				maxStreams = v
			}
			if !f.IsAck() {
				wmu.Lock()
				fr.WriteSettingsAck()
				wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			if f.ErrCode == http2.ErrCodeRefusedStream {
				refused++
			}
		}
	}
	if err := <-write; err != nil {
		t.Fatal(err)
	}
	if maxStreams == 0 || maxStreams > 4096 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want a bound of at most 4096", maxStreams)
	}
	if want := streams - int(maxStreams); maxStreams > 0 && refused < want {
		t.Errorf("%d of %d stalled calls refused, want at least %d", refused, streams, want)
	}
	// Other connections are still served.
	cl := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	if _, err := cl.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "c1", Resource: "/api/limited"}); err != nil {
		t.Errorf("a check on another connection: %v", err)
	}
}

// TestPanicAnsweredNotFatal makes a check panic (an event sink that panics
// on denials) on every API: the call is answered as an internal error, the
// panic logged, and the process keeps serving.
func TestPanicAnsweredNotFatal(t *testing.T) {
	var logs lockedBuffer
	td := start(t, policyText(), func(c *daemon.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.EventSinks = []events.Sink{sinkFunc(func(ev *events.Event) {
			if ev.Type == events.RateLimitExceeded && ev.ClientID == "boom" {
				panic("sink failed")
			}
		})}
	})
	cl := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	req := &sluicev1.CheckRequest{ClientId: "boom", Resource: "/api/limited"}
	for range 3 {
		if _, err := cl.CheckRateLimit(ctx(t), req); err != nil {
			t.Fatal(err)
		}
	}
	_, err := cl.CheckRateLimit(ctx(t), req)
	if status.Code(err) != codes.Internal {
		t.Errorf("gRPC check that panicked: %v, want Internal", err)
	}
	r := td.check(t, `{"client_id":"boom","resource":"/api/limited"}`)
	if r.status != http.StatusInternalServerError || r.str("error") != "internal_error" {
		t.Errorf("HTTP check that panicked: %d %s, want 500 internal_error", r.status, r.raw)
	}
	// Still serving, on both listeners.
	if _, err := cl.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "other", Resource: "/api/limited"}); err != nil {
		t.Errorf("gRPC check after a panic: %v", err)
	}
	if r := td.check(t, `{"client_id":"other","resource":"/api/limited"}`); r.status != http.StatusOK {
		t.Errorf("HTTP check after a panic: %d %s", r.status, r.raw)
	}
	if n := strings.Count(logs.String(), "sink failed"); n != 2 {
		t.Errorf("panics logged %d times, want 2:\n%s", n, logs.String())
	}
}

// TestGRPCHeaderListBounded sends a call whose metadata exceeds the
// bound: HPACK lets a client send a header once and then refer to it in
// one byte, and grpc-go keeps about a hundred bytes per header field
// received, so without a bound a call of a few hundred kilobytes on the
// wire held tens of megabytes until its message came.
func TestGRPCHeaderListBounded(t *testing.T) {
	td := start(t, policyText())
	cl := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	req := &sluicev1.CheckRequest{ClientId: "meta", Resource: "/api/limited"}
	small := metadata.AppendToOutgoingContext(ctx(t), "x-request-id", "abc", "traceparent", strings.Repeat("0", 55))
	if _, err := cl.CheckRateLimit(small, req); err != nil {
		t.Fatalf("a call with ordinary metadata: %v", err)
	}
	var kv []string
	for i := range 1000 {
		kv = append(kv, "x-pad-"+strconv.Itoa(i), "v")
	}
	big := metadata.AppendToOutgoingContext(ctx(t), kv...)
	if _, err := cl.CheckRateLimit(big, req); err == nil {
		t.Errorf("a call with 1000 header fields (over 32 KiB as HTTP/2 counts them) was served")
	}
	if rem := td.remaining(t, "meta", "/api/limited", "per-client"); rem != 2 {
		t.Errorf("remaining = %d, want 2: only the ordinary call is counted", rem)
	}
}
