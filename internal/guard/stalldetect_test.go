package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestStallDetectorLearns feeds a stall detector answers at fixed instants
// and reads the timeout it learns: four times the slowest answer of the
// last one to two epochs, at least the floor, off when it would reach the
// deadline.
func TestStallDetectorLearns(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var s stallDetector
	s.deadline = 5 * time.Second
	steps := []struct {
		sent, got time.Duration // the answer's send and receive instants, from t0
		want      time.Duration // the timeout after it
	}{
		{0, 10 * time.Millisecond, DefaultStallFloor},                              // fast: the floor
		{time.Second, time.Second + 400*time.Millisecond, 1600 * time.Millisecond}, // 4 x 400 ms
		{2 * time.Second, 2*time.Second + 100*time.Millisecond, 1600 * time.Millisecond},
		{11 * time.Second, 11*time.Second + 50*time.Millisecond, 1600 * time.Millisecond}, // a new epoch keeps the last one's slowest
		{22 * time.Second, 22*time.Second + 50*time.Millisecond, DefaultStallFloor},       // two epochs on, the 400 ms is forgotten
		{23 * time.Second, 25 * time.Second, 0},                                           // 4 x 2 s reaches the deadline: off
	}
	for i, st := range steps {
		s.answered(at(st.sent), at(st.got))
		if got := s.timeout(); got != st.want {
			t.Errorf("step %d: answer of %s: timeout %s, want %s", i, st.got-st.sent, got, st.want)
		}
	}
	for _, fixed := range []time.Duration{-1, 2 * time.Second, 5 * time.Second} {
		s := stallDetector{fixed: fixed, deadline: 5 * time.Second}
		want := fixed
		if fixed < 0 || fixed >= s.deadline {
			want = 0
		}
		if got := s.timeout(); got != want {
			t.Errorf("fixed %s: timeout %s, want %s", fixed, got, want)
		}
	}
}

// TestStallDetectorStalledAndBlocked: a call gives up when the store has
// answered nothing for the timeout since the later of the call's start and
// the store's last answer; after that, calls fail at once but for one
// probe per timeout, until the store answers again.
func TestStallDetectorStalledAndBlocked(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const timeout = time.Second
	var s stallDetector
	if s.stalled(s.clock(t0), at(time.Hour), timeout) {
		t.Error("stalled before the store's first answer")
	}
	s.answered(t0, at(10*time.Millisecond))
	for _, c := range []struct {
		start, now time.Duration
		want       bool
	}{
		{0, 999 * time.Millisecond, false},
		{0, 1010 * time.Millisecond, true},                             // a second after the last answer
		{5 * time.Second, 5*time.Second + 999*time.Millisecond, false}, // idle before the call is no stall
		{5 * time.Second, 6 * time.Second, true},
		{0, time.Hour, false}, // no timeout: never
	} {
		tm := timeout
		if c.now == time.Hour {
			tm = 0
		}
		if got := s.stalled(s.clock(at(c.start)), at(c.now), tm); got != c.want {
			t.Errorf("stalled(start %s, now %s) = %v, want %v", c.start, c.now, got, c.want)
		}
	}
	if got, want := s.wakeIn(s.clock(at(5*time.Second)), at(5*time.Second+300*time.Millisecond), timeout), 700*time.Millisecond; got != want {
		t.Errorf("wakeIn = %s, want %s", got, want)
	}
	if s.blocked(at(2*time.Second), timeout) {
		t.Error("blocked before any call gave up")
	}
	s.trip(at(2 * time.Second))
	for _, c := range []struct {
		now  time.Duration
		want bool
	}{
		{2 * time.Second, false},                     // the first call after the trip probes
		{2*time.Second + 500*time.Millisecond, true}, // the others fail at once
		{3 * time.Second, false},                     // one probe per timeout
		{3*time.Second + time.Millisecond, true},
	} {
		if got := s.blocked(at(c.now), timeout); got != c.want {
			t.Errorf("after a stall, blocked at %s = %v, want %v", c.now, got, c.want)
		}
	}
	s.answered(at(3*time.Second), at(3*time.Second+10*time.Millisecond))
	if s.blocked(at(3*time.Second+20*time.Millisecond), timeout) {
		t.Error("blocked after the store answered again")
	}
}

// TestStallEndsTheWait runs in a testing/synctest bubble: a store that
// answered promptly and then hangs has its calls given up at the learned
// stall timeout (the floor, 1 s), long before the 5 s deadline; after one
// probe, calls fail at once, and once the store answers again they go
// through.
func TestStallEndsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1 << 30, Window: time.Second})
		for _, gatherers := range []int{0, -1} {
			f.SetHang(0)
			g := newGuard(t, f, Config{Deadline: 5 * time.Second, Gatherers: gatherers, Breaker: BreakerConfig{Disabled: true}})
			ctx := context.Background()
			if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
				t.Fatal(err)
			}
			f.SetHang(3 * time.Second)
			start := time.Now()
			_, _, err := check1(ctx, g, "k", p, 1)
			if took, most := time.Since(start), DefaultStallFloor+g.sweepEvery(); !errors.Is(err, ErrStalled) || took < DefaultStallFloor || took > most {
				t.Errorf("gatherers %d: store hangs: err %v after %s, want ErrStalled after [%s, %s]", gatherers, err, took, DefaultStallFloor, most)
			}
			// The next call probes the store (and stalls too); the others
			// made while it waits fail at once.
			probed := make(chan error)
			go func() { _, _, err := check1(ctx, g, "k", p, 1); probed <- err }()
			synctest.Wait()
			start = time.Now()
			if _, _, err := check1(ctx, g, "k", p, 1); !errors.Is(err, ErrStalled) || time.Since(start) != 0 {
				t.Errorf("gatherers %d: during the probe of a stalled store: err %v after %s, want ErrStalled at once", gatherers, err, time.Since(start))
			}
			if err := <-probed; !errors.Is(err, ErrStalled) {
				t.Errorf("gatherers %d: probe of a stalled store: err %v, want ErrStalled", gatherers, err)
			}
			f.SetHang(0)
			time.Sleep(6 * time.Second) // the hung calls return: the store answered
			if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
				t.Errorf("gatherers %d: store back: %v", gatherers, err)
			}
		}
	})
}

// TestStallDetectorStarved: time the process could not run (its heartbeat
// beat late) is not the store's silence. The store answers at t0; the
// next beat, due 20 ms later, runs 1.5 s late (the process starved): at
// that instant the store has been silent for 1.5 s by the wall clock but
// for 40 ms on the awake clock, and the call gives up only once the
// process has run, on time, for the rest of the timeout.
func TestStallDetectorStarved(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const timeout = time.Second
	var s stallDetector
	s.beat.next(t0.UnixNano()) // a beat at t0: the next is due at 20 ms
	s.answered(t0, t0)
	since := s.clock(t0)
	// The beat due at 20 ms has not run yet: the awake clock stands still
	// from 20 ms plus the slack.
	for _, c := range []struct {
		now   time.Duration
		awake time.Duration // on the awake clock, from t0
	}{
		{10 * time.Millisecond, 10 * time.Millisecond},
		{40 * time.Millisecond, 40 * time.Millisecond},
		{500 * time.Millisecond, 40 * time.Millisecond},
		{1500 * time.Millisecond, 40 * time.Millisecond},
	} {
		if got := time.Duration(s.clock(at(c.now)) - t0.UnixNano()); got != c.awake {
			t.Errorf("beat late, at %s: awake clock %s, want %s", c.now, got, c.awake)
		}
	}
	if s.stalled(since, at(1500*time.Millisecond), timeout) {
		t.Error("stalled at 1.5 s while the process could not run")
	}
	s.beat.next(at(1500 * time.Millisecond).UnixNano()) // the late beat runs
	for d := 1520 * time.Millisecond; d < 3*time.Second; d += beatEvery {
		s.beat.next(at(d).UnixNano()) // then on time
	}
	for _, c := range []struct {
		now  time.Duration
		want bool
	}{
		{1500 * time.Millisecond, false},
		{2400 * time.Millisecond, false},
		{2460 * time.Millisecond, true}, // 40 ms before the late beat, 960 ms after
	} {
		if got := s.stalled(since, at(c.now), timeout); got != c.want {
			t.Errorf("stalled at %s = %v, want %v (awake clock %s)", c.now, got, c.want, time.Duration(s.clock(at(c.now))-t0.UnixNano()))
		}
	}
	if got, want := s.wakeIn(since, at(2*time.Second), timeout), 460*time.Millisecond; got != want {
		t.Errorf("wakeIn at 2 s = %s, want %s", got, want)
	}
	// An idle heartbeat (no call in flight) counts nothing, however long
	// until the next beat.
	s.beat.idle()
	before := s.clock(at(3 * time.Second))
	if got, want := s.clock(at(time.Hour))-before, int64(time.Hour-3*time.Second); got != want {
		t.Errorf("idle heartbeat: the awake clock ran %s in %s", time.Duration(got), time.Hour-3*time.Second)
	}
}

// TestHeartbeatIdle: the heartbeat beats only while store calls are in
// flight, and the idle time between is not counted as time the process
// could not run.
func TestHeartbeatIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inflight atomic.Int64
		h := heartbeat{inflight: &inflight}
		inflight.Add(1)
		h.start()
		h.start() // one goroutine beats
		time.Sleep(time.Second)
		if !h.running.Load() {
			t.Fatal("no beat while a call is in flight")
		}
		if now := time.Now(); h.awake(now) != now.UnixNano() {
			t.Errorf("beats on time: awake clock %s behind", time.Duration(now.UnixNano()-h.awake(now)))
		}
		inflight.Add(-1)
		time.Sleep(2 * beatEvery)
		synctest.Wait()
		if h.running.Load() {
			t.Fatal("beats on with no call in flight")
		}
		time.Sleep(time.Hour)
		inflight.Add(1)
		h.start()
		now := time.Now()
		if got, want := h.awake(now), now.UnixNano(); got != want {
			t.Errorf("awake clock %d after an idle hour, want the wall clock's %d", got, want)
		}
		inflight.Add(-1)
		time.Sleep(2 * beatEvery)
	})
}

// TestStarvedIsNotStalled runs in a testing/synctest bubble: a store whose
// answers take 3 s while the guard's heartbeat cannot beat (held, as in a
// process that cannot run) is waited for, where the same store with the
// heartbeat beating is given up on at the stall timeout (1 s). For every
// way of waiting: gathered, a call per check.
func TestStarvedIsNotStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		settle(t)
		f := &guardtest.Faulty{Inner: newMemory(t, nil)}
		p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1 << 30, Window: time.Second})
		for _, gatherers := range []int{0, -1} {
			for _, held := range []bool{false, true} {
				f.SetDelay(0)
				g := newGuard(t, f, Config{Deadline: 5 * time.Second, Gatherers: gatherers, Breaker: BreakerConfig{Disabled: true}})
				release := make(chan struct{})
				if held {
					g.stall.beat.hold = func() { <-release }
				}
				ctx := context.Background()
				if _, _, err := check1(ctx, g, "k", p, 1); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Second) // the heartbeat of the first call goes idle
				f.SetDelay(3 * time.Second)
				start := time.Now()
				_, _, err := check1(ctx, g, "k", p, 1)
				took := time.Since(start)
				close(release)
				switch {
				case held && (err != nil || took != 3*time.Second):
					t.Errorf("gatherers %d, heartbeat held: err %v after %s, want the store's answer after 3s", gatherers, err, took)
				case !held && (!errors.Is(err, ErrStalled) || took > DefaultStallFloor+g.sweepEvery()):
					t.Errorf("gatherers %d, heartbeat beating: err %v after %s, want ErrStalled after at most %s", gatherers, err, took, DefaultStallFloor+g.sweepEvery())
				}
				time.Sleep(3 * time.Second)
			}
		}
	})
}

// TestRedisAnsweredWhileStarved: through a proxy that delays every Redis
// answer by 2 s, a check made while the guard's heartbeat cannot beat
// (held, as in a process that cannot run and so reads the answers late)
// is decided by Redis, with a stall timeout of 500 ms: the silence is
// the process's. The same check with the heartbeat beating is given up on
// as stalled.
func TestRedisAnsweredWhileStarved(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: 2 s per Redis answer")
	}
	srv := redistest.Start(t)
	proxy := guardtest.StartProxy(t, srv.Addr)
	// Timeouts of the client above the latency: it would close a
	// connection that answers nothing for that long, or give up; and a
	// connection it opens meanwhile (the client opens its connections
	// lazily) would fail its handshake.
	st, err := redis.New(redis.Config{Addrs: []string{proxy.Addr()}, Timeout: 5 * time.Second, WriteTimeout: 5 * time.Second, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var holding atomic.Bool
	release := make(chan struct{})
	g := newGuard(t, st, Config{Deadline: 10 * time.Second, StallTimeout: 500 * time.Millisecond, Breaker: BreakerConfig{Disabled: true}})
	g.stall.beat.hold = func() {
		if holding.Load() {
			<-release
		}
	}
	p := params(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 1000, Window: time.Hour})
	ctx := context.Background()
	if _, _, err := check1(ctx, g, "starved", p, 1); err != nil {
		t.Fatal(err)
	}
	proxy.Latency(t, 2000)
	holding.Store(true)
	d, src, err := check1(ctx, g, "starved", p, 1)
	holding.Store(false)
	close(release)
	if err != nil || src != engine.SourceStore || !d.Allowed {
		t.Errorf("heartbeat held: %+v from %s, err %v; want admitted by the store", d, src, err)
	}
	if _, _, err := check1(ctx, g, "starved", p, 1); !errors.Is(err, ErrStalled) {
		t.Errorf("heartbeat beating: err %v, want ErrStalled", err)
	}
}
