package guard

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestCloseUnderLoad closes a guard with every feature on, on a real Redis,
// while 16 callers check hot and cold keys through it, some of them
// giving up early: every check in flight is answered, checks after Close
// are answered, and once the callers stop no goroutine of the guard is
// left.
func TestCloseUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	rs, err := redis.New(redis.Config{Addrs: []string{srv.Addr}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1 << 20, Window: time.Minute})
	g, err := New(rs, Config{Deadline: 50 * time.Millisecond, HotKeys: HotKeyConfig{Enabled: true, Threshold: 200, SyncInterval: 5 * time.Millisecond, Window: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var checks, answered atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if i%3 == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%500)*time.Microsecond)
				}
				key := "hot"
				if w%2 == 0 {
					key = fmt.Sprint("cold", w, i%100)
				}
				checks.Add(1)
				check1(ctx, g, key, p, 1)
				answered.Add(1)
				cancel()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if g.Stats().HotKeys == 0 {
		t.Error("no hot key before Close")
	}
	g.Close()
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("callers still waiting 5s after Close: %d checks, %d answered", checks.Load(), answered.Load())
	}
	if left := guardGoroutines(5 * time.Second); left != "" {
		t.Errorf("goroutines of the guard left after Close and the callers' end:\n%s", left)
	}
	t.Logf("%d checks, stats %+v", checks.Load(), g.Stats())
}

// guardGoroutines waits up to d for the goroutines running the guard's
// code to end, and returns the stacks of those left.
func guardGoroutines(d time.Duration) string {
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		var left []string
		for _, st := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(st, "guard.(*Guard)") {
				left = append(left, st)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
	}
}
