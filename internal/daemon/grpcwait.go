package daemon

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/tap"
)

// requestWaits ends the unary gRPC calls whose request has not come in
// full within a bound. grpc-go reads a unary call's request (its message
// and the client's half-close) before any interceptor runs, and waits for
// it for ever, holding a handler; only the context the transport reads
// the call with can end that wait, and only a tap handle can choose it.
//
// The tap gives each unary call a context of its own, cancelable, and
// lists it; the interceptor takes it off the list once the request has
// come; a sweeper goroutine cancels the calls listed longer than the bound,
// which then end with DeadlineExceeded, and drops those that ended
// otherwise (the client reset them, or sent an invalid request). One
// sweeper costs less than a timer per call. Its methods are safe for
// concurrent use.
type requestWaits struct {
	bound time.Duration
	tick  time.Duration // the sweeper's period
	// unary holds the full names of the methods whose calls are bounded;
	// set before the server serves, read-only after.
	unary map[string]bool
	// epoch counts the sweeper's ticks; a call is stamped with it when
	// listed.
	epoch  atomic.Int64
	next   atomic.Uint32 // picks a shard
	shards []waitShard
}

// waitShard is a list of waiting calls. The calls are spread over several,
// so that the calls of many cores seldom wait for the same lock.
type waitShard struct {
	mu    sync.Mutex
	calls []*waitCtx // requires mu
	_     [32]byte   // pads the shard to 64 bytes, so that two seldom share a cache line
}

// waitCtx is the context of a bounded call: a cancelable context of its
// own, which reports DeadlineExceeded once the sweeper ends the call, and
// its place in a list.
type waitCtx struct {
	context.Context
	cancel   context.CancelFunc
	shard    *waitShard
	epoch    int64
	idx      int         // index in shard.calls, -1 when not listed; requires shard.mu
	timedOut atomic.Bool // set by the sweeper before it cancels the call
}

// waitKey is the context key under which a waitCtx finds itself.
type waitKey struct{}

func (c *waitCtx) Value(key any) any {
	if key == (waitKey{}) {
		return c
	}
	return c.Context.Value(key)
}

func (c *waitCtx) Err() error {
	err := c.Context.Err()
	if err != nil && c.timedOut.Load() {
		return context.DeadlineExceeded
	}
	return err
}

func newRequestWaits(bound time.Duration) *requestWaits {
	w := &requestWaits{bound: bound, tick: min(bound/4, 250*time.Millisecond), unary: map[string]bool{},
		shards: make([]waitShard, runtime.GOMAXPROCS(0))}
	w.tick = max(w.tick, time.Millisecond)
	return w
}

// boundMethods lists the unary methods of srv, whose calls the tap
// bounds. It is called once all the services are registered, before srv
// serves.
func (w *requestWaits) boundMethods(srv *grpc.Server) {
	for name, svc := range srv.GetServiceInfo() {
		for _, m := range svc.Methods {
			if !m.IsClientStream && !m.IsServerStream {
				w.unary["/"+name+"/"+m.Name] = true
			}
		}
	}
}

// tap is the server's tap handle: it lists each call of a unary method.
// grpc-go calls it on the connection's reading goroutine, before the call
// has a handler.
func (w *requestWaits) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !w.unary[info.FullMethodName] {
		return ctx, nil
	}
	c := &waitCtx{epoch: w.epoch.Load()}
	c.Context, c.cancel = context.WithCancel(ctx)
	s := &w.shards[w.next.Add(1)%uint32(len(w.shards))]
	c.shard = s
	s.mu.Lock()
	c.idx = len(s.calls)
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return c, nil
}

// arrived takes the call of ctx off its list: its request has come.
func arrived(ctx context.Context) {
	c, ok := ctx.Value(waitKey{}).(*waitCtx)
	if !ok {
		return
	}
	s := c.shard
	s.mu.Lock()
	s.unlist(c)
	s.mu.Unlock()
}

// unlist takes c off s.calls, when it is there; requires s.mu.
func (s *waitShard) unlist(c *waitCtx) {
	if c.idx < 0 {
		return
	}
	last := len(s.calls) - 1
	s.calls[c.idx] = s.calls[last]
	s.calls[c.idx].idx = c.idx
	s.calls[last] = nil
	s.calls = s.calls[:last]
	c.idx = -1
}

// unaryInterceptor wraps the server's interceptor next, rather than being
// chained to it, which would cost every call an allocation: once an
// interceptor runs, the call's request has come.
func (w *requestWaits) unaryInterceptor(next grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		arrived(ctx)
		return next(ctx, req, info, handler)
	}
}

// sweep cancels, every tick until ctx ends, the calls listed for longer
// than the bound, and drops those that ended otherwise, so that a call
// reset by its client is held a tick at most.
func (w *requestWaits) sweep(ctx context.Context) {
	t := time.NewTicker(w.tick)
	defer t.Stop()
	// A call listed in epoch e has waited at least (n-1) ticks at epoch
	// e+n: it is cancelled when it has waited at least the bound, and at
	// most a tick more.
	ticks := int64((w.bound+w.tick-1)/w.tick) + 1
	var expired []*waitCtx
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		epoch := w.epoch.Add(1)
		for i := range w.shards {
			s := &w.shards[i]
			s.mu.Lock()
			for j := 0; j < len(s.calls); {
				c := s.calls[j]
				switch {
				case closed(c.Done()):
					s.unlist(c)
				case epoch-c.epoch >= ticks:
					c.timedOut.Store(true)
					s.unlist(c)
					expired = append(expired, c)
				default:
					j++
				}
			}
			s.mu.Unlock()
		}
		for i, c := range expired {
			c.cancel()
			expired[i] = nil
		}
		expired = expired[:0]
	}
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
