package daemon_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/daemon"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// h2Conn is a raw HTTP/2 connection to the gRPC listener, for calls no
// gRPC client makes: headers without a message, a message without the
// half-close.
type h2Conn struct {
	conn net.Conn
	fr   *http2.Framer
	mu   sync.Mutex // the framer's writes
}

// dialH2 connects to addr and sends the client preface and settings.
func dialH2(t *testing.T, addr string) *h2Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	c := &h2Conn{conn: conn, fr: http2.NewFramer(conn, conn)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

// callHeaders is the header block of a call to method.
func callHeaders(method string) []byte {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "sluice"},
		{":path", method}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return hb.Bytes()
}

// grpcMessage frames m as a gRPC message.
func grpcMessage(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// ackSettings acknowledges the server's SETTINGS frame f.
func (c *h2Conn) ackSettings(f *http2.SettingsFrame) {
	if !f.IsAck() {
		c.mu.Lock()
		c.fr.WriteSettingsAck()
		c.mu.Unlock()
	}
}

func (c *h2Conn) headers(id uint32, block []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
}

func (c *h2Conn) data(id uint32, p []byte, end bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fr.WriteData(id, end, p)
}

// statuses reads frames until want calls have their grpc-status or d
// passes, and returns each call's status and when it came.
func (c *h2Conn) statuses(want int, d time.Duration) (map[uint32]string, map[uint32]time.Time) {
	got, at := map[uint32]string{}, map[uint32]time.Time{}
	c.conn.SetReadDeadline(time.Now().Add(d))
	for len(got) < want {
		f, err := c.fr.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			c.ackSettings(f)
		case *http2.MetaHeadersFrame:
			if v := f.PseudoValue("status"); v != "" && v != "200" {
				got[f.StreamID], at[f.StreamID] = "http "+v, time.Now()
			}
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					got[f.StreamID], at[f.StreamID] = hf.Value, time.Now()
				}
			}
		}
	}
	return got, at
}

// TestGRPCStalledCallsEnd opens unary calls that send their headers and
// never their message, and calls that send their message and never
// half-close: grpc-go reads a unary call's request before any handler code
// runs and would wait for it for ever, each call holding a goroutine. They
// must end with DeadlineExceeded once they have waited the read timeout,
// and the goroutines go back to what they were. A call whose request comes
// within the bound, and a streaming call that lasts longer, are not cut.
func TestGRPCStalledCallsEnd(t *testing.T) {
	const bound = time.Second
	td := start(t, policyText(), func(c *daemon.Config) { c.GRPCReadTimeout = bound })
	cc := dial(t, td.GRPCAddr())
	if _, err := sluicev1.NewRateLimiterClient(cc).CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "c1", Resource: "/api/limited"}); err != nil {
		t.Fatal(err)
	}
	watchCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	watch, err := healthpb.NewHealthClient(cc).Watch(watchCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()

	// More stalled calls than grpc-go has stream workers
	// (max(128, 32*GOMAXPROCS)), so that most hold a goroutine of their
	// own.
	calls := min(1000, max(128, 32*runtime.GOMAXPROCS(0))+400)
	check := callHeaders("/sluice.v1.RateLimiter/CheckRateLimit")
	noMessage, noHalfClose := dialH2(t, td.GRPCAddr()), dialH2(t, td.GRPCAddr())
	msg := grpcMessage(t, &sluicev1.CheckRequest{ClientId: "stalled", Resource: "/api/limited"})
	opened := time.Now()
	for i := range calls {
		id := uint32(2*i + 1)
		if err := noMessage.headers(id, check); err != nil {
			t.Fatal(err)
		}
		if err := noHalfClose.headers(id, check); err != nil {
			t.Fatal(err)
		}
		if err := noHalfClose.data(id, msg, false); err != nil {
			t.Fatal(err)
		}
	}
	// Until shortly before the first stalled calls may end, the goroutines
	// they hold are counted, at their most (unless opening them took that
	// long, on a very busy machine).
	held, counted := 0, false
	for time.Now().Before(opened.Add(bound*9/10)) && held < calls {
		held, counted = max(held, runtime.NumGoroutine()-before), true
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d stalled calls hold %d goroutines (counted: %v)", 2*calls, held, counted)
	if counted && held < calls/2 {
		t.Errorf("%d stalled calls hold %d goroutines: the test does not show what it should", 2*calls, held)
	}

	// A call whose message and half-close come a fifth of the bound late.
	late := dialH2(t, td.GRPCAddr())
	if err := late.headers(1, check); err != nil {
		t.Fatal(err)
	}
	time.Sleep(bound / 5)
	if err := late.data(1, grpcMessage(t, &sluicev1.CheckRequest{ClientId: "late", Resource: "/api/limited"}), true); err != nil {
		t.Fatal(err)
	}
	if got, _ := late.statuses(1, 5*time.Second); got[1] != "0" {
		t.Errorf("a call whose request came %s after its headers: grpc-status %q, want 0 (OK)", bound/5, got[1])
	}
	var wg sync.WaitGroup
	for name, c := range map[string]*h2Conn{"no message": noMessage, "no half-close": noHalfClose} {
		wg.Go(func() {
			got, at := c.statuses(calls, bound+10*time.Second)
			if len(got) != calls {
				t.Errorf("%s: %d of %d stalled calls ended within %s of the read timeout", name, len(got), calls, 10*time.Second)
			}
			var first time.Time
			for id, st := range got {
				if st != "4" {
					t.Errorf("%s: call %d ended with grpc-status %q, want 4 (DeadlineExceeded)", name, id, st)
				}
				if first.IsZero() || at[id].Before(first) {
					first = at[id]
				}
			}
			if waited := first.Sub(opened); len(got) > 0 && waited < bound {
				t.Errorf("%s: a stalled call ended after %s, before the read timeout (%s)", name, waited, bound)
			}
		})
	}
	wg.Wait()

	// The goroutines of the calls are gone: those of the two connections
	// (grpc-go's three per connection) remain.
	deadline := time.Now().Add(5 * time.Second)
	after := runtime.NumGoroutine()
	for after > before+10 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		after = runtime.NumGoroutine()
	}
	if after > before+10 {
		t.Errorf("goroutines: %d before the stalled calls, %d after they ended", before, after)
	}

	// The health watch opened before lives on.
	recv := make(chan error, 1)
	go func() {
		_, err := watch.Recv()
		recv <- err
	}()
	select {
	case err := <-recv:
		t.Errorf("a health watch open longer than the read timeout ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}
