package daemon

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/stats"
)

// connLimit is a listener that holds at most max connections open at
// once: when they are all open, Accept waits until one closes, and the
// connections that come meanwhile wait in the kernel's accept queue. It
// logs a warning when it starts to wait, at most once a minute.
//
// Idle connections do not exhaust the bound: when all are open, the one
// idle the longest (no call in flight for idleEvictAfter at least, or no
// call yet since it was accepted that long ago) is closed to make room,
// as its client would reconnect when it has a call to make. It knows
// which calls are in flight from activity, grpc-go's stats handler; with
// none, no connection is closed.
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
	open      []openConn // the connections handed out, some maybe closed since
	warned    time.Time  // when the last warning was logged
	activity  *connActivity
}

// openConn is a connection connLimit handed out.
type openConn struct {
	raw      syscall.RawConn
	conn     net.Conn
	addr     string // the remote address, as the stats handler sees it
	accepted time.Time
}

// idleEvictAfter is how long a connection must have had no call in
// flight to be closed when the connections are at their bound.
const idleEvictAfter = time.Second

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
		if l.closeIdle(time.Now()) {
			continue
		}
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
			l.open = append(l.open, openConn{raw: raw, conn: c, addr: c.RemoteAddr().String(), accepted: time.Now()})
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
	for _, oc := range l.open {
		// Control fails once the connection is closed.
		if oc.raw.Control(func(uintptr) {}) == nil {
			l.open[n] = oc
			n++
		}
	}
	clear(l.open[n:])
	l.open = l.open[:n]
	return n
}

// closeIdle closes the connection idle the longest, if one has been idle
// for idleEvictAfter at now, and reports whether it did.
func (l *connLimit) closeIdle(now time.Time) bool {
	if l.activity == nil {
		return false
	}
	victim := -1
	var oldest time.Time
	for i := range l.open {
		oc := &l.open[i]
		since, busy := l.activity.idleSince(oc.addr)
		if busy {
			continue
		}
		if since.IsZero() {
			since = oc.accepted
		}
		if now.Sub(since) >= idleEvictAfter && (victim < 0 || since.Before(oldest)) {
			victim, oldest = i, since
		}
	}
	if victim < 0 {
		return false
	}
	l.log.Info("gRPC connections at their bound: closing the one idle the longest", "max_conns", l.max, "remote", l.open[victim].addr, "idle", now.Sub(oldest).Round(time.Millisecond))
	l.open[victim].conn.Close()
	l.open[victim] = l.open[len(l.open)-1]
	l.open[len(l.open)-1] = openConn{}
	l.open = l.open[:len(l.open)-1]
	return true
}

// connActivity is a grpc-go stats handler that knows, per connection (by
// remote address), how many calls are in flight and when the last one
// ended. It is safe for concurrent use.
type connActivity struct {
	mu    sync.Mutex
	conns map[string]*connState // guarded by mu
}

type connState struct {
	addr   string
	active int       // calls in flight
	idle   time.Time // when the last call ended, or the connection began
}

type connStateKey struct{}

func newConnActivity() *connActivity { return &connActivity{conns: map[string]*connState{}} }

// idleSince returns when the connection from addr last had a call in
// flight (zero when unknown), or busy when it has one now.
func (a *connActivity) idleSince(addr string) (since time.Time, busy bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.conns[addr]
	if st == nil {
		return time.Time{}, false
	}
	return st.idle, st.active > 0
}

// TagConn implements stats.Handler.
func (a *connActivity) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	st := &connState{idle: time.Now()}
	if info.RemoteAddr != nil {
		st.addr = info.RemoteAddr.String()
		a.mu.Lock()
		a.conns[st.addr] = st
		a.mu.Unlock()
	}
	return context.WithValue(ctx, connStateKey{}, st)
}

// HandleConn implements stats.Handler.
func (a *connActivity) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); !ok {
		return
	}
	st, _ := ctx.Value(connStateKey{}).(*connState)
	if st == nil {
		return
	}
	a.mu.Lock()
	if a.conns[st.addr] == st {
		delete(a.conns, st.addr)
	}
	a.mu.Unlock()
}

// TagRPC implements stats.Handler.
func (a *connActivity) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC implements stats.Handler.
func (a *connActivity) HandleRPC(ctx context.Context, s stats.RPCStats) {
	st, _ := ctx.Value(connStateKey{}).(*connState)
	if st == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		a.mu.Lock()
		st.active++
		a.mu.Unlock()
	case *stats.End:
		a.mu.Lock()
		st.active--
		st.idle = time.Now()
		a.mu.Unlock()
	}
}

// Close closes the listener and ends the wait of Accept.
func (l *connLimit) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}
