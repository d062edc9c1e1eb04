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
// allows: the next one waits, unserved, until one of them closes, and a
// warning says why.
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
