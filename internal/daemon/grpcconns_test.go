package daemon_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sluicehq/sluice/internal/daemon"
)

// TestGRPCConnectionsBounded opens as many gRPC connections as the bound
// allows: the next one waits, unserved, until one of them closes (or has
// been idle for a second), and a warning says why.
func TestGRPCConnectionsBounded(t *testing.T) {
	var logs lockedBuffer
	td := start(t, policyText(), func(c *daemon.Config) {
		c.GRPCMaxConns = 2
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	served := func(c *h2Conn, d time.Duration) bool {
		c.conn.SetReadDeadline(time.Now().Add(d))
		f, err := c.fr.ReadFrame()
		if err != nil {
			return false
		}
		_, ok := f.(*http2.SettingsFrame)
		return ok
	}
	first, second := dialH2(t, td.GRPCAddr()), dialH2(t, td.GRPCAddr())
	for i, c := range []*h2Conn{first, second} {
		if !served(c, 5*time.Second) {
			t.Fatalf("connection %d of 2 not served", i+1)
		}
	}
	third := dialH2(t, td.GRPCAddr())
	if served(third, 500*time.Millisecond) {
		t.Fatal("a third connection was served with a bound of 2")
	}
	if !strings.Contains(logs.String(), "gRPC connections at their bound") {
		t.Errorf("no warning logged when connections wait:\n%s", logs.String())
	}
	first.conn.Close()
	if !served(third, 5*time.Second) {
		t.Error("the waiting connection not served after one of the two closed")
	}
}

// TestGRPCDeadClientClosed opens a connection whose client then answers
// nothing, as a client whose host died: the server must ping it once the
// connection has been silent for the keepalive, and close it when the
// ping is not answered, with the calls on it.
func TestGRPCDeadClientClosed(t *testing.T) {
	t.Parallel()
	td := start(t, policyText(), func(c *daemon.Config) { c.GRPCKeepalive = time.Second })
	c := dialH2(t, td.GRPCAddr())
	if err := c.headers(1, callHeaders("/sluice.v1.RateLimiter/CheckRateLimit")); err != nil {
		t.Fatal(err)
	}
	// The client reads what the server sends and answers nothing: with a
	// keepalive of 1s, the ping comes after 1s and goes unanswered 1s
	// later.
	if closed, _ := serverCloses(c.conn, 10*time.Second); !closed {
		t.Error("the connection of a client that answers nothing is open after 10s, with a keepalive of 1s")
	}
}

// TestGRPCClientPingsAllowed pings the server every 6s on a connection
// with no call open, as Envoy's connection keepalive may: grpc-go's
// default policy (a ping every 5 minutes at most, none without calls)
// answered the fourth ping with GOAWAY ENHANCE_YOUR_CALM.
func TestGRPCClientPingsAllowed(t *testing.T) {
	t.Parallel()
	td := start(t, policyText())
	c := dialH2(t, td.GRPCAddr())
	goaway := make(chan *http2.GoAwayFrame, 1)
	go func() {
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				c.ackSettings(f)
			case *http2.GoAwayFrame:
				goaway <- f
				return
			}
		}
	}()
	for i := range 4 {
		if i > 0 {
			select {
			case f := <-goaway:
				t.Fatalf("ping %d: GOAWAY %v %q", i, f.ErrCode, f.DebugData())
			case <-time.After(6 * time.Second):
			}
		}
		c.mu.Lock()
		err := c.fr.WritePing(false, [8]byte{byte(i)})
		c.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	select {
	case f := <-goaway:
		t.Errorf("after 4 pings 6s apart: GOAWAY %v %q", f.ErrCode, f.DebugData())
	case <-time.After(time.Second):
	}
}

// TestGRPCIdleConnectionsDoNotExhaustBound fills the bound with idle
// connections: a new one is served once the one idle the longest has been
// idle for a second, and that one is closed; a connection with a call in
// flight is not.
func TestGRPCIdleConnectionsDoNotExhaustBound(t *testing.T) {
	td := start(t, policyText(), func(c *daemon.Config) { c.GRPCMaxConns = 2 })
	served := func(c *h2Conn, d time.Duration) bool {
		c.conn.SetReadDeadline(time.Now().Add(d))
		f, err := c.fr.ReadFrame()
		if err != nil {
			return false
		}
		_, ok := f.(*http2.SettingsFrame)
		return ok
	}
	busy, idle := dialH2(t, td.GRPCAddr()), dialH2(t, td.GRPCAddr())
	for i, c := range []*h2Conn{busy, idle} {
		if !served(c, 5*time.Second) {
			t.Fatalf("connection %d of 2 not served", i+1)
		}
	}
	// A call whose request never comes keeps busy's connection busy.
	if err := busy.headers(1, callHeaders("/sluice.v1.RateLimiter/CheckRateLimit")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	third := dialH2(t, td.GRPCAddr())
	if !served(third, 5*time.Second) {
		t.Fatal("a third connection not served while one of the two is idle")
	}
	if closed, _ := serverCloses(idle.conn, 5*time.Second); !closed {
		t.Error("the idle connection is still open")
	}
	busy.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	for {
		if _, err := busy.fr.ReadFrame(); err != nil {
			if ne, ok := err.(interface{ Timeout() bool }); !ok || !ne.Timeout() {
				t.Errorf("the connection with a call in flight was closed: %v", err)
			}
			break
		}
	}
}
