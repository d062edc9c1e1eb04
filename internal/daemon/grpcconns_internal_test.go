package daemon

import (
	"log/slog"
	"net"
	"testing"
	"time"
)

// TestConnLimit accepts one connection with a bound of one: it is handed
// out unwrapped (grpc-go sets a *net.TCPConn's TCP_USER_TIMEOUT and reads
// it without a buffer per idle connection, and does neither for a
// wrapper), the next waits, and is accepted once the first is closed.
func TestConnLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newConnLimit(ln, 1, slog.New(slog.DiscardHandler))
	defer l.Close()
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := first.(*net.TCPConn); !ok {
		t.Errorf("accepted a %T, want a *net.TCPConn", first)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	select {
	case <-accepted:
		t.Fatal("a second connection accepted with a bound of one")
	case <-time.After(4 * connPoll):
	}
	first.Close()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the second connection not accepted after the first closed")
	}
	// Close ends a wait, the second connection being open.
	waiting := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		waiting <- err
	}()
	time.Sleep(2 * connPoll)
	l.Close()
	select {
	case err := <-waiting:
		if err == nil {
			t.Error("Accept after Close: no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the wait of Accept")
	}
}
