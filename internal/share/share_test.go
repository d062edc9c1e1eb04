package share

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// waited returns how long next took, on the bubble's clock.
func waited(next func()) time.Duration {
	start := time.Now()
	next()
	return time.Since(start)
}

func TestNilGate(t *testing.T) {
	var g *Gate
	if New(Config{Share: 1}) != nil {
		t.Fatal("New with a share of 1: want nil, no gate")
	}
	if g.Bulk(1000) {
		t.Error("a nil gate calls a request bulk")
	}
	g.EndSmall(g.StartSmall())
	turn := g.StartBulk(context.Background())
	turn.Next(context.Background())
	turn.End()
	var none *Turn
	none.Next(context.Background())
}

func TestBulk(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		n    int
		want bool
	}{
		{Config{}, 16, false},
		{Config{}, 17, true},
		{Config{BulkChecks: 64}, 64, false},
		{Config{BulkChecks: 64}, 65, true},
	} {
		if got := New(c.cfg).Bulk(c.n); got != c.want {
			t.Errorf("%+v: Bulk(%d) = %v, want %v", c.cfg, c.n, got, c.want)
		}
	}
}

// TestShare: while a small request is in progress, a bulk request that ran 10ms waits until bulk work has had
// its share of the time (half, give or take the 1ms lent ahead).
func TestShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.5})
		turn := g.StartBulk(ctx)
		small := g.StartSmall()
		if !small {
			t.Fatal("a small request beside a bulk one is not counted")
		}
		time.Sleep(10 * time.Millisecond)
		// 1ms lent + 5ms of share - 10ms run: 4ms owed, repaid at half
		// speed.
		if got, want := waited(func() { turn.Next(ctx) }), 8*time.Millisecond; got != want {
			t.Errorf("waited %s after a 10ms slice, want %s", got, want)
		}
		// Nothing lent now: 0.5ms of share - 1ms run.
		time.Sleep(time.Millisecond)
		if got := waited(func() { turn.Next(ctx) }); got != time.Millisecond {
			t.Errorf("waited %s after a 1ms slice, want 1ms", got)
		}
		g.EndSmall(small)
		time.Sleep(10 * time.Millisecond)
		if got := waited(func() { turn.Next(ctx) }); got != 0 {
			t.Errorf("waited %s 10ms after the last small request, want 0", got)
		}
		turn.End()
		if got := g.StartSmall(); got {
			t.Error("a small request is counted with no bulk one in progress")
		}
	})
}

// TestShareNoSmall: 10ms after the last small request ended, bulk work
// runs at once.
func TestShareNoSmall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.5})
		turn := g.StartBulk(ctx)
		defer turn.End()
		g.EndSmall(g.StartSmall())
		time.Sleep(5 * time.Millisecond)
		if got := waited(func() { turn.Next(ctx) }); got == 0 {
			t.Error("did not wait 5ms after a small request ended")
		}
		time.Sleep(10 * time.Millisecond)
		if got := waited(func() { turn.Next(ctx) }); got != 0 {
			t.Errorf("waited %s 10ms after the last small request ended, want 0", got)
		}
	})
}

// TestSharePause: a paused request holds no lane and takes no time.
func TestSharePause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.5, CPUs: 1})
		a := g.StartBulk(ctx)
		defer g.EndSmall(g.StartSmall())
		a.Pause()
		time.Sleep(50 * time.Millisecond)
		if got := waited(func() { b := g.StartBulk(ctx); b.End() }); got != 0 {
			t.Errorf("another request waited %s beside a paused one, want 0", got)
		}
		if got := waited(func() { a.Resume(ctx) }); got != 0 {
			t.Errorf("resuming after a 50ms pause waited %s, want 0", got)
		}
		a.End()
	})
}

// TestShareDeadline: a bulk request waits at most half of the time its
// context had left when it began; then its slices run at once.
func TestShareDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		g := New(Config{Share: 0.5})
		turn := g.StartBulk(ctx)
		defer turn.End()
		defer g.EndSmall(g.StartSmall())
		time.Sleep(40 * time.Millisecond)
		// 38ms owed, 10ms left before half of the deadline.
		if got := waited(func() { turn.Next(ctx) }); got != 10*time.Millisecond {
			t.Errorf("waited %s, want 10ms (half of the deadline)", got)
		}
		time.Sleep(10 * time.Millisecond)
		if got := waited(func() { turn.Next(ctx) }); got != 0 {
			t.Errorf("waited %s past half of the deadline, want 0", got)
		}
	})
}

// TestShareCanceled: a canceled context ends the wait.
func TestShareCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		g := New(Config{Share: 0.5})
		turn := g.StartBulk(ctx)
		defer turn.End()
		defer g.EndSmall(g.StartSmall())
		time.Sleep(100 * time.Millisecond)
		time.AfterFunc(3*time.Millisecond, cancel)
		if got := waited(func() { turn.Next(ctx) }); got != 3*time.Millisecond {
			t.Errorf("waited %s, want 3ms (until canceled)", got)
		}
	})
}

// TestShareOverlap: bulk requests at work at once are charged the time
// during which any of them ran, not the sum of their times.
func TestShareOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.5})
		a, b := g.StartBulk(ctx), g.StartBulk(ctx)
		defer g.EndSmall(g.StartSmall())
		time.Sleep(10 * time.Millisecond)
		b.End()
		if got, want := waited(func() { a.Next(ctx) }), 8*time.Millisecond; got != want {
			t.Errorf("waited %s after two 10ms slices at once, want %s", got, want)
		}
		a.End()
	})
}

// TestShareLanes: while bulk and small requests contend, bulk slices run
// at most as many at once as the share of the CPUs (one at least); when
// they do not, as many as come.
func TestShareLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.25, CPUs: 8})
		var turns []Turn
		for range 2 {
			turns = append(turns, g.StartBulk(ctx))
		}
		small := g.StartSmall()
		start := time.Now()
		started := make(chan time.Duration, 1)
		go func() {
			t := g.StartBulk(ctx)
			started <- time.Since(start)
			t.End()
		}()
		time.Sleep(100 * time.Microsecond)
		turns[0].End()
		if third, want := <-started, 100*time.Microsecond; third != want {
			t.Errorf("a third bulk slice on 2 lanes started after %s, want %s (when one ended)", third, want)
		}
		g.EndSmall(small)
		turns = append(turns, g.StartBulk(ctx), g.StartBulk(ctx))
		for _, turn := range turns[1:] {
			turn.End()
		}
	})
}

// TestShareWakeups: a bulk request waiting while small requests come and
// go is woken when it may go, not to look again every millisecond.
func TestShareWakeups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.5, CPUs: 1})
		a := g.StartBulk(ctx)
		small := g.StartSmall()
		start := time.Now()
		started := make(chan time.Duration, 1)
		go func() {
			b := g.StartBulk(ctx)
			started <- time.Since(start)
			b.End()
		}()
		// A small request every millisecond for 100ms; the first bulk
		// request's slice runs 2ms, then it waits on the store.
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
					g.EndSmall(g.StartSmall())
				}
			}
		}()
		time.Sleep(2 * time.Millisecond)
		a.Pause()
		// 1ms lent + 1ms of share - 2ms run: nothing owed, the lane is
		// free.
		if got, want := <-started, 2*time.Millisecond; got != want {
			t.Errorf("the second request started after %s, want %s (when the first paused)", got, want)
		}
		time.Sleep(30 * time.Millisecond)
		a.Resume(ctx)
		// Owed nothing: goes at once.
		time.Sleep(10 * time.Millisecond)
		w := g.Stats().Waits
		// 10ms run, 1ms lent, 5ms of share: 4ms owed, repaid at half speed.
		if got, want := waited(func() { a.Next(ctx) }), 8*time.Millisecond; got != want {
			t.Errorf("waited %s, want %s", got, want)
		}
		if n := g.Stats().Waits - w; n != 1 {
			t.Errorf("woken %d times in an 8ms wait for the debt, want 1", n)
		}
		close(stop)
		g.EndSmall(small)
		a.End()
	})
}

// TestShareOrder: waiting bulk requests go in the order they began, and
// one that waits on the debt wakes when it is repaid; the others sleep
// meanwhile.
func TestShareOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.5, CPUs: 1})
		a := g.StartBulk(ctx)
		small := g.StartSmall()
		var order []int
		done := make(chan struct{})
		for i := range 3 {
			go func() {
				b := g.StartBulk(ctx)
				order = append(order, i)
				time.Sleep(time.Millisecond)
				b.End()
				done <- struct{}{}
			}()
			synctest.Wait() // each one waits before the next begins
		}
		time.Sleep(4 * time.Millisecond)
		// 1ms lent + 2ms of share - 4ms run: 1ms owed, repaid in 2ms;
		// then each of the three runs 1ms and owes 0.5ms, repaid in 1ms.
		start := time.Now()
		a.End()
		for range 3 {
			<-done
		}
		if got, want := time.Since(start), 7*time.Millisecond; got != want {
			t.Errorf("three waiting 1ms requests took %s, want %s", got, want)
		}
		if !slices.Equal(order, []int{0, 1, 2}) {
			t.Errorf("went in the order %v, want [0 1 2]", order)
		}
		// Each is woken when it comes first in the queue (to keep the
		// time), when the lane frees, when its debt is repaid.
		if n := g.Stats().Waits; n > 9 {
			t.Errorf("woken %d times, want at most 9 (three each)", n)
		}
		g.EndSmall(small)
	})
}

// TestShareContentionEnds: 10ms after the last small request ended, every
// waiting bulk request goes, without a slice ending.
func TestShareContentionEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := New(Config{Share: 0.5, CPUs: 1})
		a := g.StartBulk(ctx)
		defer a.End()
		small := g.StartSmall()
		start := time.Now()
		started := make(chan time.Duration, 3)
		for range 3 {
			go func() {
				b := g.StartBulk(ctx)
				started <- time.Since(start)
				b.End()
			}()
		}
		time.Sleep(25 * time.Millisecond)
		g.EndSmall(small)
		for range 3 {
			if got, want := <-started, 35*time.Millisecond; got != want {
				t.Errorf("a waiting request started after %s, want %s (10ms after the last small request)", got, want)
			}
		}
	})
}

// BenchmarkSmall is the cost of a gate on a small request: with no bulk
// request in progress, one atomic load.
func BenchmarkSmall(b *testing.B) {
	g := New(Config{})
	for b.Loop() {
		g.EndSmall(g.StartSmall())
	}
}
