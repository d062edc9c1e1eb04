// The gRPC and Envoy targets' caller over HTTP/2 connections.

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The methods the gRPC callers call.
const (
	pathShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	pathCheckRateLimit  = "/sluice.v1.RateLimiter/CheckRateLimit"
	pathBatchCheck      = "/sluice.v1.RateLimiter/BatchCheck"
)

// h2Caller sends the gRPC and Envoy targets' calls over h2Conns.
type h2Caller struct {
	r     *run
	conns []*h2Conn
	next  atomic.Uint32
}

func newH2Caller(cfg *Config, r *run) (caller, func(), error) {
	path := callPath(cfg)
	h := &h2Caller{r: r}
	closeAll := func() {
		for _, c := range h.conns {
			c.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range cfg.Conns {
		c, err := dialH2(ctx, cfg.Addr, path, cfg.TLS)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("loadgen: %w", err)
		}
		h.conns = append(h.conns, c)
	}
	// Each caller has one call open at a time, on connection i % Conns:
	// the server must allow that many at once on each, or it would refuse
	// the others' calls all through the run.
	perConn := (cfg.Concurrency + cfg.Conns - 1) / cfg.Conns
	c := h.conns[0]
	c.mu.Lock()
	maxStreams := c.maxStreams
	c.mu.Unlock()
	if maxStreams > 0 && perConn > int(maxStreams) {
		closeAll()
		// A Config this server refuses: what to change is Conns.
		return nil, nil, configError{fmt.Errorf("loadgen: the server allows %d calls at once on a connection, and %d callers over %d connections need %d: give conns %d or more",
			maxStreams, cfg.Concurrency, cfg.Conns, perConn, (cfg.Concurrency+int(maxStreams)-1)/int(maxStreams))}
	}
	return h, closeAll, nil
}

func (h *h2Caller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	c := h.conns[int(h.next.Add(1))%len(h.conns)]
	if w.h2 == nil {
		w.h2 = newH2Call()
	}
	v, err := c.call(ctx, w.h2, h.r.message(w, key, cost))
	if err != nil && ctx.Err() != nil {
		w.h2 = nil // the reader may still hold the abandoned call
	}
	return h.r.verdict(v, err)
}

// loop runs the closed-loop callers of workers until sending ends or the
// request budget is spent, without a goroutine each, as wrk does: the
// goroutine that reads a reply records it and sends the caller's next
// request at once. Caller i keeps connection i mod Conns. A sweeper per
// connection ends the calls that outlive the request timeout. A caller
// whose request cannot be sent (its connection failed) stops, and the run
// ends early when every caller has. The calls in flight when sending ends
// are answered and counted, unless ctx ends, which abandons them.
func (h *h2Caller) loop(ctx, sending context.Context, workers []*worker) {
	var wg sync.WaitGroup
	var then func(*h2Call)
	then = func(call *h2Call) {
		allowed, err := h.r.verdict(call.result())
		if err != nil && ctx.Err() != nil {
			wg.Done() // the run was abandoned during the call
			return
		}
		h.r.record(call.w, call.key, call.cost, call.due, allowed, err)
		if errors.Is(err, context.DeadlineExceeded) {
			// The reader may still hold the abandoned call: go on with
			// a new one.
			call = &h2Call{then: then, w: call.w, conn: call.conn}
		}
		h.issue(ctx, sending, &wg, call)
	}
	for i, w := range workers {
		call := &h2Call{then: then, w: w, conn: h.conns[i%len(h.conns)]}
		wg.Add(1)
		h.issue(ctx, sending, &wg, call)
	}
	sweep := make(chan struct{})
	var sweepers sync.WaitGroup
	for _, c := range h.conns {
		sweepers.Go(func() { c.sweep(h.r.cfg.Timeout, sweep) })
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-ctx.Done():
	case <-finished: // every caller has stopped, its last call answered
	}
	close(sweep)
	sweepers.Wait()
	// When ctx ended, the calls still in flight end uncounted; none
	// starts any more.
	for _, c := range h.conns {
		c.mu.Lock()
		c.stopped = true
		ended := c.take(func(uint32, *h2Call) bool { return true })
		c.cond.Broadcast() // a caller waiting for the server's window stops
		c.mu.Unlock()
		for range ended {
			wg.Done()
		}
	}
	<-finished
}

// issue sends call's caller's next request, or ends the caller (wg.Done)
// when sending is over or the request cannot be sent.
func (h *h2Caller) issue(ctx, sending context.Context, wg *sync.WaitGroup, call *h2Call) {
	r := h.r
	if sending.Err() != nil || (r.cfg.Requests > 0 && r.issued.Add(1) > r.cfg.Requests) {
		wg.Done()
		return
	}
	call.key, call.cost = r.pickKey(call.w), r.pickCost(call.w)
	call.due = time.Now()
	call.deadline = call.due.Add(r.cfg.Timeout)
	err := call.marshal(h.r.message(call.w, call.key, call.cost))
	if err == nil {
		_, err = call.conn.send(ctx, call, false)
		if errors.Is(err, errWindow) {
			// Rare: wait for the server's window on a goroutine of its
			// own, not on the reader that will receive it, until the
			// request's deadline.
			go func() {
				wctx, cancel := context.WithDeadline(ctx, call.deadline)
				_, err := call.conn.send(wctx, call, true)
				cancel()
				switch {
				case err == nil:
				case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
					// Timed out as a call whose reply is late does.
					call.err = context.DeadlineExceeded
					complete(call)
				default:
					h.refused(ctx, wg, call, err)
				}
			}()
			return
		}
	}
	if err != nil {
		h.refused(ctx, wg, call, err)
	}
}

// refused ends the caller of call, whose request could not be sent,
// counting the error unless the run was abandoned.
func (h *h2Caller) refused(ctx context.Context, wg *sync.WaitGroup, call *h2Call, err error) {
	if ctx.Err() == nil && !errors.Is(err, errStopped) {
		h.r.record(call.w, call.key, call.cost, call.due, false, err)
	}
	wg.Done()
}
