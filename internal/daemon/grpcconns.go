package daemon

import (
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// connLimit is a listener that holds at most max connections open at
// once: when they are all open, Accept waits until one closes, and the
// connections that come meanwhile wait in the kernel's accept queue. It
// logs a warning when it starts to wait, at most once a minute.
//
// It hands out the connections it accepts as they are, unwrapped: grpc-go
// gives a *net.TCPConn its keepalive timeout as the socket's
// TCP_USER_TIMEOUT and reads it without pinning a buffer per idle
// connection, and does neither for a wrapped one. So it learns that a
// connection closed by asking its socket, only when all are open.
//
// Accept must not be called concurrently (grpc-go's Serve calls it from
// one goroutine); Close may be called at any time.
type connLimit struct {
	net.Listener
	max       int
	log       *slog.Logger
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	open      []syscall.RawConn // the connections handed out, some maybe closed since
	warned    time.Time         // when the last warning was logged
}

// connPoll is how often Accept looks for a closed connection while all
// are open.
const connPoll = 50 * time.Millisecond

func newConnLimit(ln net.Listener, max int, log *slog.Logger) *connLimit {
	return &connLimit{Listener: ln, max: max, log: log, done: make(chan struct{})}
}

// Accept waits until fewer than max connections are open, then for a
// connection.
func (l *connLimit) Accept() (net.Conn, error) {
	for l.reap() >= l.max {
		if now := time.Now(); now.Sub(l.warned) >= time.Minute {
			l.warned = now
			l.log.Warn("gRPC connections at their bound; new connections wait until one closes", "max_conns", l.max)
		}
		select {
		case <-time.After(connPoll):
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// A listener of "tcp" accepts *net.TCPConn, a syscall.Conn.
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			l.open = append(l.open, raw)
		}
	}
	return c, nil
}

// reap forgets the connections that are closed, when all max are open,
// and returns how many are open.
func (l *connLimit) reap() int {
	if len(l.open) < l.max {
		return len(l.open)
	}
	n := 0
	for _, raw := range l.open {
		// Control fails once the connection is closed.
		if raw.Control(func(uintptr) {}) == nil {
			l.open[n] = raw
			n++
		}
	}
	clear(l.open[n:])
	l.open = l.open[:n]
	return n
}

// Close closes the listener and ends the wait of Accept.
func (l *connLimit) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}
