package guardtest

import (
	"bufio"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer starts a TCP server on 127.0.0.1 that sends back every line
// it reads; it stops when the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip sends a line through c and waits for it to come back, at most
// wait; it returns how long that took.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, wait time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := c.SetReadDeadline(start.Add(wait)); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "ping\n" {
		t.Fatalf("echo = %q, want %q", line, "ping\n")
	}
	return time.Since(start), nil
}

// TestProxy drives a toxiproxy-server through the proxy's methods: traffic
// flows, waits under latency, stops under a stall and flows again once
// cleared. `make deps` runs it to build toxiproxy-server ahead of the
// tests.
func TestProxy(t *testing.T) {
	up := echoServer(t)
	start := time.Now()
	p := StartProxy(t, up)
	t.Logf("proxy started in %v", time.Since(start).Round(time.Millisecond))
	if p.Upstream() != up {
		t.Errorf("Upstream() = %q, want %q", p.Upstream(), up)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial the proxy at %s: %v", p.Addr(), err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(t, c, r, 5*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	p.Latency(t, 100)
	d, err := roundTrip(t, c, r, 5*time.Second)
	if err != nil {
		t.Fatalf("under latency: %v", err)
	}
	if d < 100*time.Millisecond {
		t.Errorf("round trip under 100ms of latency took %v", d)
	}
	p.Clear(t)

	p.Stall(t)
	if _, err := roundTrip(t, c, r, 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("under a stall: err = %v, want a read timeout", err)
	}
	p.Clear(t)
	// Toxiproxy closes the connections a stall held; new ones flow.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial the proxy after clear: %v", err)
	}
	defer c2.Close()
	if _, err := roundTrip(t, c2, bufio.NewReader(c2), 5*time.Second); err != nil {
		t.Fatalf("after clear: %v", err)
	}

	// Disabled: connections are closed and new ones refused; enabled
	// again, they flow.
	p.Disable(t)
	if _, err := roundTrip(t, c2, bufio.NewReader(c2), time.Second); err == nil {
		t.Error("a round trip through a disabled proxy went through")
	}
	if c3, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c3.Close()
		t.Error("a disabled proxy accepted a connection")
	}
	p.Enable(t)
	c4, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial the proxy enabled again: %v", err)
	}
	defer c4.Close()
	if _, err := roundTrip(t, c4, bufio.NewReader(c4), 5*time.Second); err != nil {
		t.Fatalf("enabled again: %v", err)
	}
}
