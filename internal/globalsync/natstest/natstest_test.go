package natstest

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// TestServer starts the server, stops (and kills) it and starts it again
// on the same port, checking each time that it greets a client as NATS
// does.
func TestServer(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	greet := func() error {
		c, err := net.DialTimeout("tcp", s.Addr(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, "INFO ") || !strings.Contains(line, `"jetstream":true`) {
			t.Errorf("greeting %q, want INFO with jetstream", line)
		}
		return nil
	}
	if err := greet(); err != nil {
		t.Fatalf("running server: %v", err)
	}
	s.Stop()
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Fatalf("stopped server still accepts connections")
	}
	if err := s.Start(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := greet(); err != nil {
		t.Fatalf("restarted server: %v", err)
	}
	s.Kill()
	if err := s.Start(); err != nil {
		t.Fatalf("start after a kill: %v", err)
	}
	if err := greet(); err != nil {
		t.Fatalf("server started after a kill: %v", err)
	}
	if a, b := s.Name("s"), s.Name("s"); a == b {
		t.Errorf("Name returned %q twice", a)
	}
}
