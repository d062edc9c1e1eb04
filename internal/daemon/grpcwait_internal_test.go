package daemon

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/tap"
)

// listed counts the calls w lists.
func (w *requestWaits) listed() int {
	n := 0
	for i := range w.shards {
		s := &w.shards[i]
		s.mu.Lock()
		n += len(s.calls)
		s.mu.Unlock()
	}
	return n
}

// TestRequestWaits follows calls through the tap, the interceptor and the
// sweeper: a call whose request comes is never cut; one whose request
// does not come ends with DeadlineExceeded once it has waited the bound
// and at most a tick more; one that ends otherwise (the client reset it)
// is dropped at the next tick; a streaming call is not listed.
func TestRequestWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bound = time.Second
		w := newRequestWaits(bound)
		w.unary["/s/Unary"] = true
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { w.sweep(ctx) })
		defer func() {
			stop()
			wg.Wait()
		}()
		call := func(parent context.Context, method string) context.Context {
			c, err := w.tap(parent, &tap.Info{FullMethodName: method})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		bg := context.Background()

		streaming := call(bg, "/s/Streaming")
		if streaming != bg || w.listed() != 0 {
			t.Errorf("a streaming call was listed (%d listed)", w.listed())
		}

		served := call(bg, "/s/Unary")
		stalled := call(bg, "/s/Unary")
		parent, reset := context.WithCancel(bg)
		resetCall := call(parent, "/s/Unary")
		if w.listed() != 3 {
			t.Fatalf("listed %d calls, want 3", w.listed())
		}
		arrived(served)
		reset()
		time.Sleep(w.tick)
		synctest.Wait()
		if n := w.listed(); n != 1 {
			t.Errorf("after one tick: %d calls listed, want 1 (the stalled call)", n)
		}
		if err := resetCall.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("a call reset by its client: %v, want Canceled", err)
		}

		time.Sleep(bound - 2*w.tick)
		synctest.Wait()
		if err := stalled.Err(); err != nil {
			t.Errorf("a call cut before it waited the bound: %v", err)
		}
		time.Sleep(2 * w.tick)
		synctest.Wait()
		if err := stalled.Err(); err != context.DeadlineExceeded {
			t.Errorf("a call that waited the bound and a tick more: %v, want DeadlineExceeded", err)
		}
		if w.listed() != 0 {
			t.Errorf("%d calls still listed", w.listed())
		}
		if err := served.Err(); err != nil {
			t.Errorf("a call whose request came: %v", err)
		}
	})
}

// BenchmarkRequestWaits measures what the read timeout costs a unary
// call: the tap, the interceptor's arrival and the end of the call, beside
// the same call's context without them.
func BenchmarkRequestWaits(b *testing.B) {
	info := &tap.Info{FullMethodName: "/s/Unary"}
	for _, bounded := range []bool{false, true} {
		name := "unbounded"
		if bounded {
			name = "bounded"
		}
		b.Run(name, func(b *testing.B) {
			w := newRequestWaits(10 * time.Second)
			w.unary["/s/Unary"] = true
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			go w.sweep(ctx)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					// The stream's context, as grpc-go makes it.
					parent, cancel := context.WithCancel(context.Background())
					c := context.WithValue(parent, waitKey{}, nil)
					if bounded {
						c, _ = w.tap(c, info)
					}
					_ = c.Done() // the transport takes it for its reader and writer
					arrived(c)
					cancel()
				}
			})
		})
	}
}
