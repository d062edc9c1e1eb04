package guard_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestStallDetectedWithDefaults pauses Redis (SIGSTOP) for two seconds
// under load, with the guard's default settings: a 5 s deadline and a
// learned stall timeout. The checks made while Redis is paused end within
// the stall timeout (not the deadline), fall back for the reason
// "stalled", and once a call has given up, the others fail at once until
// Redis answers again.
func TestStallDetectedWithDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: pauses Redis under load")
	}
	srv := redistest.Start(t)
	st := newRedisStore(t, srv.Addr)
	eng, g := newFaultEngine(t, st, faultPolicy, guard.Config{})
	warmUp(t, eng)
	stall := g.Stats().StallTimeout
	if stall < guard.DefaultStallFloor || stall >= guard.DefaultDeadline {
		t.Fatalf("learned stall timeout %s, want in [%s, %s)", stall, guard.DefaultStallFloor, guard.DefaultDeadline)
	}
	l := startLoad(eng, 4, time.Millisecond, mixed)
	time.Sleep(300 * time.Millisecond)
	from := time.Now()
	if err := srv.Process().Signal(syscall.SIGSTOP); err != nil {
		l.stop()
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := srv.Process().Signal(syscall.SIGCONT); err != nil {
		l.stop()
		t.Fatal(err)
	}
	to := time.Now()
	waitClosed(g)
	ss := l.stop()
	in := between(ss, from, to)
	_, p99, worst := latencies(in)
	reasons := map[engine.Fallback]int{}
	for _, s := range in {
		if s.err != nil {
			t.Fatalf("check while paused: %v", s.err)
		}
		if fellBack(s) {
			reasons[s.res.Fallback]++
		}
	}
	t.Logf("Redis paused 2s: %d checks, p99 %s, max %s; stall timeout %s; fallbacks by reason %v",
		len(in), p99, worst, stall, reasons)
	if reasons[engine.FallbackStalled] == 0 || reasons[engine.FallbackDeadline] != 0 {
		t.Errorf("fallbacks by reason %v, want some stalled and none past the deadline", reasons)
	}
	// After the first calls gave up, the others fail at once (one call
	// per stall timeout goes to see whether Redis is back).
	if p50, _, _ := latencies(in); p50 > stall/2 {
		t.Errorf("p50 %s while paused, want most checks answered at once once the stall was detected", p50)
	}
	// The stall timeout, the sweeper's period and a margin for a machine
	// busy with other tests: under the deadline.
	if worst >= guard.DefaultDeadline {
		t.Errorf("worst latency %s while paused, want under the %s deadline (stall timeout %s)", worst, guard.DefaultDeadline, stall)
	}
	if !eventuallyClosed(eng, g) {
		t.Errorf("breaker %s after Redis resumed", g.BreakerState())
	}
}

// TestSlowStoreIsWaitedFor puts 1.2 s of latency on every Redis answer,
// past the stall floor but within the deadline: once the guard has seen
// one answer, it learns the latency and waits for the store.
func TestSlowStoreIsWaitedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: 1.2 s per Redis answer")
	}
	srv := redistest.Start(t)
	proxy := guardtest.StartProxy(t, srv.Addr)
	// A write timeout above the latency: the client closes a connection
	// that answers nothing for that long.
	st, err := redis.New(redis.Config{Addrs: []string{proxy.Addr()}, WriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng, g := newFaultEngine(t, st, faultPolicy, guard.Config{})
	warmUp(t, eng)
	const latency = 1200 * time.Millisecond
	proxy.Latency(t, int(latency.Milliseconds()))
	c := engine.Check{ClientID: "slow", Resource: "/local", Cost: 1}
	if _, ok := waitFor(10*time.Second, func() bool {
		res, err := eng.Check(context.Background(), &c)
		return err == nil && res.Source == engine.SourceStore
	}); !ok {
		t.Fatalf("no check decided by the store through %s of latency in 10 s; stall timeout %s", latency, g.Stats().StallTimeout)
	}
	if st := g.Stats().StallTimeout; st != 0 && st < 4*latency {
		t.Errorf("stall timeout %s after answers of %s, want at least 4 times that (or 0: at or above the deadline)", st, latency)
	}
	// One at a time: the store answers each call in 1.2 s.
	sources := map[engine.Source]int{}
	for i := range 5 {
		c := engine.Check{ClientID: "slow", Resource: "/local", Cost: 1}
		if i%2 == 0 {
			c.Resource = "/closed"
		}
		res, err := eng.Check(context.Background(), &c)
		if err != nil {
			t.Fatal(err)
		}
		sources[res.Source]++
	}
	if sources[engine.SourceStore] != 5 {
		t.Errorf("5 checks through %s of latency decided by %v, want all by the store", latency, sources)
	}
}

// waitFor calls cond until it holds, for up to d.
func waitFor(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return time.Since(start), true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), false
}
