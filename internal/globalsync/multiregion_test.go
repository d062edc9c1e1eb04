package globalsync

// The multi-region tests: three regions, each with its own redis-server
// and two Sluice engines (instances), each instance with its own Sync to
// one NATS server, reached through the region's own TCP proxy
// (toxiproxy), which adds the latency between regions and cuts a region
// off. Run them with
//
//	go test -race -count=1 -run MultiRegion -v ./internal/globalsync/

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// globalPolicy: 1,000 a minute per client across all regions; each
// region's own limit is far above it, so that only the global one binds.
const globalPolicy = `version: 1
rules:
  - { id: partner, match: { resource: /partner }, dimension: client, limit: 1000000, window: 1m, global_limit: 1000 }
`

const globalLimit = 1000

// interRegionMs is the latency added between each region and NATS, in the
// direction from NATS to the region: a count published in one region
// reaches another that much later.
const interRegionMs = 100

type instance struct {
	region string
	eng    *engine.Engine
	sync   *Sync
	// lat records check latencies while set.
	mu  sync.Mutex
	lat []time.Duration
}

type region struct {
	name  string
	redis *redistest.Server
	proxy *guardtest.Proxy
	inst  [2]*instance
}

// world is the regions of one test, on one clock: every check is made at
// base plus the time since start, base being the start of a window well
// ahead, so that the whole test falls in one window of its global limit
// (a minute) and nothing of it expires while it runs.
type world struct {
	regions []*region
	offset  atomic.Int64 // from the real clock to the test's
	base    time.Time    // the start of the current window; set by rebase
}

func (w *world) now() time.Time { return time.Now().Add(time.Duration(w.offset.Load())) }

// rebase moves the test's clock to the start of a window ahead of any
// used so far: each scenario has a window of its own.
func (w *world) rebase() {
	w.base = w.now().Truncate(time.Minute).Add(2 * time.Minute)
	w.offset.Store(int64(time.Until(w.base)))
}

func startWorld(t *testing.T, stream string, names ...string) *world {
	t.Helper()
	w := &world{}
	w.rebase()
	pol, err := policy.Parse("global.yaml", []byte(globalPolicy))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		r := &region{name: name, redis: redistest.Start(t), proxy: guardtest.StartProxy(t, srv.Addr())}
		r.proxy.Latency(t, interRegionMs)
		for i := range r.inst {
			st, err := redis.New(redis.Config{Addrs: []string{r.redis.Addr}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			peers := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == name })
			s, err := Start(context.Background(), Config{Region: name, URL: "nats://" + r.proxy.Addr(),
				Stream: stream, Instance: fmt.Sprintf("%s-%d", name, i), Peers: peers})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			eng, err := engine.New(engine.Config{Store: st, Policy: pol, Now: w.now, Global: KeyView{Sync: s}})
			if err != nil {
				t.Fatal(err)
			}
			r.inst[i] = &instance{region: name, eng: eng, sync: s}
		}
		w.regions = append(w.regions, r)
	}
	return w
}

// demand drives checks of client at rate per second into each region
// (split over its two instances) until stop, and returns the admissions.
type demand struct {
	admitted atomic.Int64
	byRegion sync.Map // region -> *atomic.Int64
	errors   atomic.Int64
	fellBack atomic.Int64 // admitted without the store deciding
}

func (d *demand) add(region string) {
	d.admitted.Add(1)
	v, _ := d.byRegion.LoadOrStore(region, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (d *demand) of(region string) int64 {
	v, ok := d.byRegion.Load(region)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// drive sends checks of client into in at rate a second until ctx ends.
func (d *demand) drive(ctx context.Context, in *instance, client string, rate func() float64, record bool) {
	next := time.Now()
	for ctx.Err() == nil {
		r := rate()
		if r <= 0 {
			time.Sleep(10 * time.Millisecond)
			next = time.Now()
			continue
		}
		next = next.Add(time.Duration(float64(time.Second) / r))
		time.Sleep(time.Until(next))
		c := engine.Check{ClientID: client, Resource: "/partner", Cost: 1}
		start := time.Now()
		res, err := in.eng.Check(context.Background(), &c)
		took := time.Since(start)
		if err != nil {
			d.errors.Add(1)
			continue
		}
		if record {
			in.mu.Lock()
			in.lat = append(in.lat, took)
			in.mu.Unlock()
		}
		if res.Allowed {
			d.add(in.region)
			if res.Source != engine.SourceStore {
				d.fellBack.Add(1)
			}
		}
	}
}

// run drives the demand of client, rates[region] a second at time since
// the run's start, over every instance, for dur; it then waits settle and
// returns the admissions.
func (w *world) run(client string, dur time.Duration, rates func(region string, since time.Duration) float64) *demand {
	d := &demand{}
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, r := range w.regions {
		for _, in := range r.inst {
			wg.Go(func() {
				d.drive(ctx, in, client, func() float64 { return rates(r.name, time.Since(start)) / 2 }, false)
			})
		}
	}
	wg.Wait()
	return d
}

// globalCount returns, as instance in sees it, the count of client's
// global limit in the test's window: its region's own (from a check that
// consumes nothing) and the others'.
func (w *world) views(t *testing.T, client string) []int64 {
	t.Helper()
	var out []int64
	for _, r := range w.regions {
		for _, in := range r.inst {
			c := engine.Check{ClientID: client, Resource: "/partner", Cost: 0}
			res, err := in.eng.Check(context.Background(), &c)
			if err != nil {
				t.Fatal(err)
			}
			g, ok := res.GlobalRemaining()
			if !ok {
				t.Fatalf("no global limit in %+v", res)
			}
			out = append(out, g)
		}
	}
	return out
}

// percentile returns the q-quantile of ds (q from 0 to 1), 0 for none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(float64(len(s))*q), len(s)-1)]
}

// window returns the sync's name of client's global window in w.
func (w *world) window(t *testing.T, client string) Window {
	t.Helper()
	pol, err := policy.Parse("global.yaml", []byte(globalPolicy))
	if err != nil {
		t.Fatal(err)
	}
	key, ok := pol.Rules[0].AppendGlobalKey(nil, &policy.Request{ClientID: client, Resource: "/partner"})
	if !ok {
		t.Fatal("no global key")
	}
	return Window{Key: string(key), Start: w.base.UnixMilli(), Length: time.Minute}
}

// merged returns, per instance, the sum of every region's count of
// client's window as that instance knows it.
func (w *world) merged(t *testing.T, client string) []int64 {
	t.Helper()
	win := w.window(t, client)
	var out []int64
	for _, r := range w.regions {
		for _, in := range r.inst {
			var sum int64
			for _, n := range in.sync.Counts(win) {
				sum += n
			}
			out = append(out, sum)
		}
	}
	return out
}

// split6031 is demand well above the limit (36,000 a minute), split
// 60/30/10 over the regions in order.
func split603010(names []string) func(string, time.Duration) float64 {
	share := map[string]float64{names[0]: 0.6, names[1]: 0.3, names[2]: 0.1}
	return func(region string, _ time.Duration) float64 { return 600 * share[region] }
}

func TestMultiRegion(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: three regions of real servers, and a partition of 30 seconds")
	}
	names := []string{"eu", "us", "ap"}
	w := startWorld(t, srv.Name("MULTI"), names...)
	const runFor = 4 * time.Second

	t.Run("split", func(t *testing.T) {
		w.rebase()
		for i := range 5 {
			client := fmt.Sprintf("split-%d", i)
			d := w.run(client, runFor, split603010(names))
			t.Logf("run %d: admitted %d (eu %d, us %d, ap %d) of a global limit of %d", i, d.admitted.Load(), d.of("eu"), d.of("us"), d.of("ap"), globalLimit)
			if n := d.admitted.Load(); n < 990 || n > 1010 {
				t.Errorf("run %d: admitted %d, want 990 to 1010", i, n)
			}
		}
	})

	t.Run("moving", func(t *testing.T) {
		w.rebase()
		// 18,000 a minute, most of it from eu, then from ap: the heavy
		// region changes halfway to the limit.
		moving := func(region string, since time.Duration) float64 {
			heavy := "eu"
			if since > 1700*time.Millisecond {
				heavy = "ap"
			}
			if region == heavy {
				return 200
			}
			return 50
		}
		for i := range 5 {
			client := fmt.Sprintf("moving-%d", i)
			d := w.run(client, runFor+time.Second, moving)
			t.Logf("run %d: admitted %d (eu %d, us %d, ap %d)", i, d.admitted.Load(), d.of("eu"), d.of("us"), d.of("ap"))
			if n := d.admitted.Load(); n < 990 || n > 1010 {
				t.Errorf("run %d: admitted %d, want 990 to 1010", i, n)
			}
		}
	})

	t.Run("lag", func(t *testing.T) {
		for _, r := range w.regions {
			for _, in := range r.inst {
				for _, p := range in.sync.Status().Peers {
					t.Logf("%s: from %s, sync lag p95 %d ms", r.name, p.Region, p.SyncLagMs)
					if p.SyncLagMs > 150 {
						t.Errorf("%s: sync lag from %s p95 %d ms with %d ms injected, want at most 150", r.name, p.Region, p.SyncLagMs, interRegionMs)
					}
				}
			}
		}
	})

	t.Run("partition", func(t *testing.T) {
		w.rebase()
		client := "partition"
		ap := w.regions[2]
		ctx, cancel := context.WithCancel(context.Background())
		var d demand
		var wg sync.WaitGroup
		rates := split603010(names)
		for _, r := range w.regions {
			for _, in := range r.inst {
				wg.Go(func() { d.drive(ctx, in, client, func() float64 { return rates(r.name, 0) / 2 }, false) })
			}
		}
		time.Sleep(500 * time.Millisecond)
		ap.proxy.Disable(t)
		cut := time.Now()
		time.Sleep(30 * time.Second)
		during := d.admitted.Load()
		ap.proxy.Enable(t)
		healed := time.Now()
		t.Logf("ap cut off for %s: admitted %d (eu %d, us %d, ap %d), %d without the store, %d errors", healed.Sub(cut).Round(time.Millisecond), during, d.of("eu"), d.of("us"), d.of("ap"), d.fellBack.Load(), d.errors.Load())
		if during > globalLimit+10 {
			t.Errorf("during the partition: admitted %d, want at most %d", during, globalLimit+10)
		}
		// After the heal, every instance converges on the count of what
		// was admitted: first on the counts made until the heal (known
		// is when every instance knows them all), then on the few units
		// the regions may still admit once they hear each other again
		// (the others counted the quiet one at its share, a little
		// more than it took), which reach the others one lag later.
		var known, agreed time.Time
		for deadline := healed.Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			m := w.merged(t, client)
			if known.IsZero() && slices.Min(m) >= during {
				known = time.Now()
			}
			if slices.Min(m) == slices.Max(m) && m[0] == d.admitted.Load() {
				agreed = time.Now()
				break
			}
		}
		cancel()
		wg.Wait()
		admitted := d.admitted.Load()
		m := w.merged(t, client)
		t.Logf("after the heal: admitted %d in all, merged counts %v; every instance knew the counts made until the heal %s after it, and all agreed %s after it",
			admitted, m, known.Sub(healed).Round(time.Millisecond), agreed.Sub(healed).Round(time.Millisecond))
		if agreed.IsZero() {
			t.Fatalf("the regions never agreed on %d: %v", admitted, m)
		}
		// The aim is 500ms: reconnecting takes the wait between tries
		// (20 to 40ms) and two lags of 100ms, the counts one lag more, and
		// the units admitted then one more lag and flush (about 0.45s
		// here). Bounded at 1.5s, for busy machines under the race
		// detector.
		if took := agreed.Sub(healed); took > 1500*time.Millisecond {
			t.Errorf("the regions agreed %s after the heal, want within 1.5s", took)
		}
		if admitted > globalLimit+10 {
			t.Errorf("admitted %d in all, want at most %d", admitted, globalLimit+10)
		}
	})

	t.Run("nats killed", func(t *testing.T) {
		w.rebase()
		client := "nats-down"
		measure := func() map[string]time.Duration {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var d demand
			var wg sync.WaitGroup
			for _, r := range w.regions {
				for _, in := range r.inst {
					in.mu.Lock()
					in.lat = in.lat[:0]
					in.mu.Unlock()
					wg.Go(func() { d.drive(ctx, in, client, func() float64 { return 100 }, true) })
				}
			}
			wg.Wait()
			out := map[string]time.Duration{}
			for _, r := range w.regions {
				var all []time.Duration
				for _, in := range r.inst {
					all = append(all, in.lat...)
				}
				out[r.name] = percentile(all, 0.99)
			}
			return out
		}
		before := measure()
		srv.Stop()
		// The server shuts down in this process: its work (and the
		// clients' first reconnection attempts) is over before the
		// checks are measured with NATS down.
		time.Sleep(500 * time.Millisecond)
		during := measure()
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			t.Logf("%s: check p99 %s with NATS up, %s with it down", name, before[name], during[name])
			if limit := 2*before[name] + latencySlack; during[name] > limit {
				t.Errorf("%s: check p99 %s with NATS down, want at most %s (twice %s and %s)", name, during[name], limit, before[name], latencySlack)
			}
		}
		// The sync resumes: the counts made while NATS was down reach
		// every region.
		var agreed bool
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !agreed; time.Sleep(50 * time.Millisecond) {
			m := w.merged(t, client)
			agreed = slices.Min(m) == slices.Max(m) && m[0] > 0
		}
		if !agreed {
			t.Errorf("after NATS restarted, the regions do not agree: %v", w.merged(t, client))
		}
	})
	t.Run("overload", func(t *testing.T) { overloaded(t, w) })
}
