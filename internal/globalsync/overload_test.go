package globalsync

// The overload test: region A driven far beyond its part of a global
// limit, on the key region B uses and on a thousand others, while B keeps
// a steady modest demand. It runs in TestMultiRegion's world, as its
// subtest "overload":
//
//	go test -count=1 -run 'TestMultiRegion/overload' -v ./internal/globalsync/

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// overloadClient is the client whose global limit A and B share.
const overloadClient = "overload"

// bKeyRate is B's demand on the shared key, checks a second over its two
// instances: 30 in a phase of 3s, far under what is left of the limit
// while A is idle, and one or two per lag, under B's part of what is left
// until the window is nearly used up.
const bKeyRate = 10

// bProbeRate is B's checks a second on keys of its own (global limits
// too, never refused), so that its latency percentiles rest on a few
// hundred checks per phase.
const bProbeRate = 100

// hammers is the number of goroutines per instance of A checking without
// pause: half on the shared key, half on a thousand others.
const hammers = 16

// phase is what one phase of the overload test measured.
type phase struct {
	mu  sync.Mutex      // guards lat
	lat []time.Duration // B's checks' latencies, shared key and probes

	bKey, bKeyAdmitted atomic.Int64 // B's checks of the shared key
	bErrors            atomic.Int64
	// refused is the window's count, as the B instance knew it, at B's
	// first refusal on the shared key, and the reserve it held for the
	// others then; -1 while B was never refused.
	refused, refusedReserve atomic.Int64

	aChecks, aKey, aKeyAdmitted, aErrors atomic.Int64

	bRedis, aRedis cmdStats
}

// cmdStats is one Redis server's figures over a phase.
type cmdStats struct {
	calls       int64   // EVALSHA
	usecPerCall float64 // Redis' time in each EVALSHA, µs (wall clock)
	// cpuPerCall is the server's CPU time (user and system) over the
	// phase, per EVALSHA, µs: its work per check, which another process
	// taking the cores does not change.
	cpuPerCall float64
	cpu        time.Duration // the server's CPU time at the start
}

// startStats resets s's command statistics and notes its CPU time.
func startStats(t *testing.T, s *redistest.Server) cmdStats {
	t.Helper()
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	return cmdStats{cpu: redisCPU(t, s)}
}

// end reads s's EVALSHA calls and time per call since startStats, and
// its CPU time per call.
func (st cmdStats) end(t *testing.T, s *redistest.Server) cmdStats {
	t.Helper()
	info, err := s.Info("commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(info["cmdstat_evalsha"], ",") {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "calls":
			st.calls, _ = strconv.ParseInt(v, 10, 64)
		case "usec_per_call":
			st.usecPerCall, _ = strconv.ParseFloat(v, 64)
		}
	}
	if st.calls > 0 {
		st.cpuPerCall = float64((redisCPU(t, s) - st.cpu).Microseconds()) / float64(st.calls)
	}
	return st
}

// paced calls check rate times a second until ctx ends.
func paced(ctx context.Context, rate float64, check func()) {
	next := time.Now()
	for ctx.Err() == nil {
		next = next.Add(time.Duration(float64(time.Second) / rate))
		time.Sleep(time.Until(next))
		check()
	}
}

// steady is B's demand on in: the shared key, whose window is win, at
// bKeyRate/2 a second and its own keys at bProbeRate/2, each check's
// latency recorded.
func (p *phase) steady(ctx context.Context, in *instance, win Window) {
	timed := func(client string) (engine.Result, bool) {
		c := engine.Check{ClientID: client, Resource: "/partner", Cost: 1}
		start := time.Now()
		res, err := in.eng.Check(context.Background(), &c)
		took := time.Since(start)
		if err != nil {
			p.bErrors.Add(1)
			return engine.Result{}, false
		}
		p.mu.Lock()
		p.lat = append(p.lat, took)
		p.mu.Unlock()
		return res, true
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		paced(ctx, bKeyRate/2, func() {
			res, ok := timed(overloadClient)
			if !ok {
				return
			}
			p.bKey.Add(1)
			if res.Allowed {
				p.bKeyAdmitted.Add(1)
				return
			}
			if p.refused.Load() < 0 {
				var known int64
				for _, n := range in.sync.Counts(win) {
					known += n
				}
				_, reserve := in.sync.OthersWithin(win, globalLimit)
				if p.refused.CompareAndSwap(-1, known) {
					p.refusedReserve.Store(reserve)
				}
			}
		})
	})
	wg.Go(func() {
		n := 0
		paced(ctx, bProbeRate/2, func() {
			n++
			timed(fmt.Sprintf("b-%s-%d", in.sync.cfg.Instance, n%50))
		})
	})
	wg.Wait()
}

// hammer checks without pause on in until ctx ends: the shared key when
// i is even, else a thousand other clients in turn.
func (p *phase) hammer(ctx context.Context, in *instance, i int, others []string) {
	for n := 0; ctx.Err() == nil; n++ {
		c := engine.Check{ClientID: overloadClient, Resource: "/partner", Cost: 1}
		if i%2 == 1 {
			c.ClientID = others[(n*hammers+i)%len(others)]
		}
		res, err := in.eng.Check(context.Background(), &c)
		p.aChecks.Add(1)
		if err != nil {
			p.aErrors.Add(1)
			continue
		}
		if i%2 == 0 {
			p.aKey.Add(1)
			if res.Allowed {
				p.aKeyAdmitted.Add(1)
			}
		}
	}
}

// measure runs one phase of dur: B's steady demand, and A's overload when
// busy.
func (w *world) measure(t *testing.T, a, b *region, busy bool, dur time.Duration) *phase {
	t.Helper()
	p := &phase{}
	p.refused.Store(-1)
	others := make([]string, 1000)
	for i := range others {
		others[i] = fmt.Sprintf("a-busy-%d", i)
	}
	win := w.window(t, overloadClient)
	aStats, bStats := startStats(t, a.redis), startStats(t, b.redis)
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	for _, in := range b.inst {
		wg.Go(func() { p.steady(ctx, in, win) })
	}
	if busy {
		for _, in := range a.inst {
			for i := range hammers {
				wg.Go(func() { p.hammer(ctx, in, i, others) })
			}
		}
	}
	wg.Wait()
	p.aRedis, p.bRedis = aStats.end(t, a.redis), bStats.end(t, b.redis)
	return p
}

// overloaded is TestMultiRegion's subtest "overload": region A (the
// first) overloaded does not change what region B (the second) is
// guaranteed, nor the time its checks take beyond what the machine they
// share takes from it.
func overloaded(t *testing.T, w *world) {
	w.rebase()
	a, b := w.regions[0], w.regions[1]
	const dur = 3 * time.Second
	idle := w.measure(t, a, b, false, dur)
	busy := w.measure(t, a, b, true, dur)

	for _, ph := range []struct {
		name string
		p    *phase
	}{{"A idle", idle}, {"A overloaded", busy}} {
		p := ph.p
		t.Logf("%s: B's checks p50 %s, p99 %s (%d checks); B's Redis %.1f µs an EVALSHA, %.1f µs of CPU (%d); A's Redis %.1f µs, %.1f µs of CPU (%d, %.0f a second); A checked %.0f a second, %d on the shared key, %d admitted",
			ph.name, percentile(p.lat, 0.5), percentile(p.lat, 0.99), len(p.lat), p.bRedis.usecPerCall, p.bRedis.cpuPerCall, p.bRedis.calls,
			p.aRedis.usecPerCall, p.aRedis.cpuPerCall, p.aRedis.calls, float64(p.aRedis.calls)/dur.Seconds(), float64(p.aChecks.Load())/dur.Seconds(),
			p.aKey.Load(), p.aKeyAdmitted.Load())
		t.Logf("%s: B admitted %d of its %d checks of the shared key; first refused at a count of %d known to it, with a reserve of %d",
			ph.name, p.bKeyAdmitted.Load(), p.bKey.Load(), p.refused.Load(), p.refusedReserve.Load())
		if n := p.bErrors.Load() + p.aErrors.Load(); n > 0 {
			t.Errorf("%s: %d checks failed", ph.name, n)
		}
	}

	// Admissions. With A idle, B's demand is far under what is left: all
	// of it is admitted. With A overloaded, A takes at most its part of
	// what is left per lag, as B may, and what it refuses reaches no one:
	// B is refused only once the window is used up but for the reserve
	// for what A may have admitted unseen: refused means B's part of the
	// rest, (L - known - reserve) / 3, is within the one to three units
	// B has in flight, so the rest is within about 10 units; 30 allows
	// for the reserve fading between the refusal and its reading. The
	// total stays within the limit.
	if idle.bKeyAdmitted.Load() != idle.bKey.Load() {
		t.Errorf("A idle: B admitted %d of %d, want all", idle.bKeyAdmitted.Load(), idle.bKey.Load())
	}
	if r := busy.refused.Load(); r >= 0 && r+busy.refusedReserve.Load() < globalLimit-30 {
		t.Errorf("A overloaded: B first refused at a count of %d and a reserve of %d, want them to add up to at least %d", r, busy.refusedReserve.Load(), globalLimit-30)
	}
	total := idle.bKeyAdmitted.Load() + busy.bKeyAdmitted.Load() + busy.aKeyAdmitted.Load()
	t.Logf("the shared key's window: %d admitted in all (A %d of %d checks, B %d of %d) of a global limit of %d",
		total, busy.aKeyAdmitted.Load(), busy.aKey.Load(), idle.bKeyAdmitted.Load()+busy.bKeyAdmitted.Load(), idle.bKey.Load()+busy.bKey.Load(), globalLimit)
	if total > globalLimit+10 {
		t.Errorf("admitted %d in all on the shared key, want at most %d", total, globalLimit+10)
	}
	// A asked for at least three times the whole limit: nine times its
	// part of it, even while all of it was left.
	if busy.aKey.Load() < 3*globalLimit {
		t.Errorf("A checked the shared key %d times, want an overload of at least %d", busy.aKey.Load(), 3*globalLimit)
	}

	// Latency. On this machine none of B's check time is isolated from
	// A: B's checks run in this process beside A's, and B's Redis on the
	// same two cores, so B's check time and even its Redis' time in each
	// command grow with A's load (logged, not bounded). What is B's alone
	// is bounded: its Redis serves B's checks alone, one EVALSHA each,
	// with the same work (CPU) for each whatever A's load (within twice
	// and 10 µs), and no check of B waits on another region, which would
	// add at least the lag between regions to every check: B's median
	// stays under it.
	if got, want := busy.bRedis.calls, int64(len(busy.lat)); got != want {
		t.Errorf("B's Redis: %d EVALSHA with A overloaded, want one per check of B (%d)", got, want)
	}
	if got, limit := busy.bRedis.cpuPerCall, 2*idle.bRedis.cpuPerCall+10; got > limit {
		t.Errorf("B's Redis: %.1f µs of CPU an EVALSHA with A overloaded, want at most %.1f (twice %.1f and 10 µs)", got, limit, idle.bRedis.cpuPerCall)
	}
	if got, limit := percentile(busy.lat, 0.5), interRegionMs*time.Millisecond; got >= limit {
		t.Errorf("B's check p50 %s with A overloaded, want under the %s between regions", got, limit)
	}
}
