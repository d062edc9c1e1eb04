package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// waitClock waits until s has an estimate of Redis' clock (on a cluster,
// of every master's), so that its fixed-window checks go plain.
func waitClock(t testing.TB, s *Store) {
	t.Helper()
	clocks := []*serverClock{&s.clock}
	if s.cluster {
		m := s.slots.Load()
		if m == nil || len(m.masters) == 0 {
			t.Fatal("no slot map")
		}
		clocks = nil
		for i := range m.masters {
			ms := &m.masters[i]
			if ms.client == nil {
				t.Fatalf("master %s: the client knows no node of that address", ms.addr)
			}
			s.startMasterClock(ms) // as its first plain-eligible check does
			clocks = append(clocks, &ms.clock.serverClock)
		}
	} else {
		s.startClock() // as a store's first plain-eligible check does
	}
	for range 500 {
		ok := true
		for _, c := range clocks {
			_, _, known := c.at(time.Now())
			ok = ok && known
		}
		if ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no reading of Redis' clock after 5s")
}

// plainRedis is the Redis the plain-path tests run on: a standalone
// server, or a Redis Cluster.
type plainRedis struct {
	addrs   []string
	masters []*redistest.Server // the server, or the cluster's masters
	cluster *redistest.Cluster  // nil for a standalone server
}

func standaloneRedis(t *testing.T) plainRedis {
	srv := redistest.Start(t)
	return plainRedis{addrs: []string{srv.Addr}, masters: []*redistest.Server{srv}}
}

// do runs a command on the server that holds key.
func (r plainRedis) do(t *testing.T, key string, args ...string) (string, error) {
	t.Helper()
	if r.cluster == nil {
		return r.masters[0].Do(args...)
	}
	return owner(t, r.cluster, key).Do(args...)
}

// resetStats resets the command statistics of every master.
func (r plainRedis) resetStats(t *testing.T) {
	t.Helper()
	for _, m := range r.masters {
		if _, err := m.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
	}
}

// stats returns the calls of every command since resetStats, summed over
// the masters (see commandStats), leaving out the client's reading of the
// cluster's topology (CLUSTER SLOTS, SHARDS), which comes when it will.
func (r plainRedis) stats(t *testing.T) map[string]int {
	t.Helper()
	sum := map[string]int{}
	for _, m := range r.masters {
		for k, v := range commandStats(t, m) {
			if !strings.HasPrefix(k, "cluster|") {
				sum[k] += v
			}
		}
	}
	return sum
}

// measure is measure of redis_test.go over every master.
func (r plainRedis) measure(t *testing.T, f func()) map[string]int {
	t.Helper()
	for range 10 {
		r.resetStats(t)
		f()
		stats := r.stats(t)
		if stats["hello"] == 0 {
			return stats
		}
	}
	t.Fatal("the client kept opening connections")
	return nil
}

// TestPlainCluster runs the tests of the plain path on a 3-master Redis
// Cluster, where each check is placed by the clock of its key's master.
func TestPlainCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	r := plainRedis{addrs: c.Addrs(), masters: c.Masters, cluster: c}
	t.Run("FixedWindowExact", func(t *testing.T) { testPlainFixedWindowExact(t, r) })
	t.Run("ResetDuringRefusals", func(t *testing.T) { testPlainResetDuringRefusals(t, r) })
	t.Run("LaterWindow", func(t *testing.T) { testPlainLaterWindow(t, r) })
	t.Run("Commands", func(t *testing.T) { testPlainCommands(t, r) })
	t.Run("MatchesScript", func(t *testing.T) { testPlainMatchesScript(t, r) })
	t.Run("CommandsPerCheck", func(t *testing.T) { testPlainCommandsPerCheck(t, r) })
}

// testPlainCommandsPerCheck counts, by INFO commandstats summed over the
// masters, the commands Redis runs per fixed-window check of cost 1 at
// Redis' clock on keys in use, plain and with ScriptsOnly, in one run:
// checks sent alone, and in calls of 10 keys of 10 identities through
// CheckParts (the service's gathered calls). Commands run by a script
// count too, and TIME (the store's reading of each master's clock, every
// second) is left in. It logs the Redis time of the commands sent, too.
func testPlainCommandsPerCheck(t *testing.T, rd plainRedis) {
	const checks = 2000
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1_000_000, Window: time.Hour})
	ctx := context.Background()
	for _, batch := range []int{1, 10} {
		for _, scriptsOnly := range []bool{false, true} {
			name := fmt.Sprintf("batch %d, ScriptsOnly %v", batch, scriptsOnly)
			s := newStore(t, Config{Addrs: rd.addrs, ScriptsOnly: scriptsOnly, Prefix: fmt.Sprintf("cpc%d%v:", batch, scriptsOnly)})
			if !scriptsOnly {
				waitClock(t, s)
			}
			reqs := make([]store.Request, 100)
			for i := range reqs {
				reqs[i] = store.Request{Key: fmt.Sprintf("rl:cpc:{user=%d}:x", i), Params: p, Cost: 1}
			}
			out := make([]sluice.Decision, len(reqs))
			run := func() {
				for i := 0; i < checks; i += batch {
					sub := reqs[i%len(reqs) : i%len(reqs)+batch]
					if err := s.CheckParts(ctx, sub, out, func(idx []int, err error) {
						if err != nil {
							t.Errorf("%s: %v", name, err)
						}
					}); err != nil {
						t.Fatal(err)
					}
				}
			}
			run() // every key's first count, its follow-ups, the scripts loaded
			waitFollowUps(t, s)
			rd.resetStats(t)
			run()
			stats, usec := rd.stats(t), 0.0
			for _, m := range rd.masters {
				info, err := m.Info("commandstats")
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range []string{"evalsha", "eval", "hincrby"} {
					if c == "hincrby" && scriptsOnly { // run by the script
						continue
					}
					v := info["cmdstat_"+c]
					if i := strings.Index(v, "usec="); i >= 0 {
						n, _ := strconv.ParseFloat(strings.SplitN(v[i+5:], ",", 2)[0], 64)
						usec += n
					}
				}
			}
			total := 0
			for _, n := range stats {
				total += n
			}
			t.Logf("%s: %.2f commands per check (%v), %.2f µs of Redis time per check", name, float64(total)/checks, stats, usec/checks)
			want := stats["hincrby"] == checks && stats["evalsha"] == 0
			if scriptsOnly {
				want = stats["evalsha"] > 0 && stats["evalsha"] <= checks
			}
			if !want {
				t.Errorf("%s: %v for %d checks", name, stats, checks)
			}
		}
	}
}

// waitFollowUps waits until s has sent the follow-ups of its plain checks.
func waitFollowUps(t testing.TB, s *Store) {
	t.Helper()
	for range 500 {
		if s.pending.Load() == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d follow-ups not sent after 5s", s.pending.Load())
}

// TestPlainEligible checks which requests may be a plain HINCRBY.
func TestPlainEligible(t *testing.T) {
	fw := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Minute})
	counting := *fw
	counting.CountRefused = true
	zero := *fw
	zero.Limit = 0
	gcra := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 10, Window: time.Minute})
	for _, c := range []struct {
		name string
		r    store.Request
		want bool
	}{
		{"unit", store.Request{Params: fw, Cost: 1}, true},
		{"cost 2", store.Request{Params: fw, Cost: 2}, false},
		{"read", store.Request{Params: fw}, false},
		{"explicit instant", store.Request{Params: fw, Cost: 1, Now: t0}, false},
		{"after", store.Request{Params: fw, Cost: 1, After: time.Second}, false},
		{"limit 0", store.Request{Params: &zero, Cost: 1}, false},
		{"counting refused, cost 7", store.Request{Params: &counting, Cost: 7}, true},
		{"counting refused, read", store.Request{Params: &counting}, false},
		{"counting refused, cost 2^33", store.Request{Params: &counting, Cost: 1 << 33}, false},
		{"gcra", store.Request{Params: gcra, Cost: 1}, false},
	} {
		if got := plainEligible(&c.r); got != c.want {
			t.Errorf("%s: plainEligible = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPlainNearBoundary checks that a check whose window is uncertain,
// near a boundary within the estimate's error and the margin, or without
// a fresh estimate, takes the script, and that a key a script decides in
// the same call stays with the script.
func TestPlainNearBoundary(t *testing.T) {
	s := &Store{maxKey: DefaultMaxKeyLength}
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Second})
	now := time.Now()
	reqs := []store.Request{{Key: "a", Params: p, Cost: 1}}
	const start = 1_700_000_000_000_000 // µs, a second's start
	margin := plainMargin.Microseconds()
	for _, c := range []struct {
		server, err int64 // µs
		want        bool
	}{
		{start + 500_000, 100, true},
		{start + margin + 101, 100, true},
		{start + margin + 99, 100, false}, // the previous second is within the error
		{start + 1_000_000 - margin - 102, 100, true},
		{start + 1_000_000 - margin - 100, 100, false},
		{start + 500_000, 500_000, false},
	} {
		s.clock.last.Store(&clockReading{local: now, server: c.server, err: c.err})
		plain, _ := s.planPlain(reqs, now)
		got := len(plain) == 1
		if got != c.want {
			t.Errorf("server %d ± %d µs: plain %v, want %v", c.server-start, c.err, got, c.want)
		}
	}
	s.clock.last.Store(&clockReading{local: now.Add(-clockFresh - time.Millisecond), server: start + 500_000, err: 100})
	if plain, _ := s.planPlain(reqs, now); len(plain) != 0 {
		t.Errorf("stale estimate: %d plain checks, want 0", len(plain))
	}
	s.clock.last.Store(&clockReading{local: now, server: start + 500_000, err: 100})
	mixed := []store.Request{{Key: "a", Params: p, Cost: 1}, {Key: "b", Params: p, Cost: 1}, {Key: "a", Params: p, Cost: 2}}
	if plain, _ := s.planPlain(mixed, now); len(plain) != 1 || plain[0].i != 1 {
		t.Errorf("mixed call: plain %+v, want request 1 alone", plain)
	}
}

// TestPlainPerMaster checks that on a cluster a check is placed by the
// clock of its key's master, and takes the script when that master's
// estimate is uncertain or missing, or when the client knows no node of
// its address.
func TestPlainPerMaster(t *testing.T) {
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Second})
	now := time.Now()
	const start = 1_700_000_000_000_000 // µs, a second's start
	node := &lateClient{}               // a client of a node; never called here
	m := &slotMap{masters: []master{
		{addr: "a", client: node, clock: &masterClock{}}, // mid-second
		{addr: "b", client: node, clock: &masterClock{}}, // at a second's start
		{addr: "c", client: node, clock: &masterClock{}}, // no reading
		{addr: "d", clock: &masterClock{}},               // no client
	}}
	m.masters[0].clock.last.Store(&clockReading{local: now, server: start + 500_000, err: 100})
	m.masters[1].clock.last.Store(&clockReading{local: now, server: start + 500, err: 100})
	m.masters[3].clock.last.Store(&clockReading{local: now, server: start + 500_000, err: 100})
	var reqs []store.Request
	for i := range 4 {
		k := "{m" + strconv.Itoa(i) + "}:k"
		m.node[slotOf(k)] = uint16(i + 1)
		reqs = append(reqs, store.Request{Key: k, Params: p, Cost: 1})
	}
	s := &Store{cluster: true, maxKey: DefaultMaxKeyLength}
	s.slots.Store(m)
	s.slotsTried.Store(now.UnixNano())
	plain, eligible := s.planPlain(reqs, now)
	if eligible != 4 || len(plain) != 1 || plain[0].i != 0 || plain[0].m != &m.masters[0] || plain[0].start != start/p.Quantum {
		t.Errorf("planPlain: %+v of %d eligible, want request 0 alone, on master a, in its second", plain, eligible)
	}
}

// TestPlainFixedWindowExact races 4 stores (4 instances) with 16
// goroutines each on one key, every check a plain HINCRBY of cost 1: the
// key admits exactly its limit although refused increments are visible to
// the others until given back, the count left in Redis is the limit (every
// refusal given back) and the key expires at its window's end.
func TestPlainFixedWindowExact(t *testing.T) { testPlainFixedWindowExact(t, standaloneRedis(t)) }

func testPlainFixedWindowExact(t *testing.T, rd plainRedis) {
	const stores, goroutines, each, limit = 4, 16, 20, 300
	ss := make([]*Store, stores)
	var reported [2]atomic.Uint64 // by OnPlain: plain, by script
	for i := range ss {
		ss[i] = newStore(t, Config{Addrs: rd.addrs, OnPlain: func(p, s int) {
			reported[0].Add(uint64(p))
			reported[1].Add(uint64(s))
		}})
		waitClock(t, ss[i])
	}
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: 1000 * time.Hour})
	const key = "rl:plain:exact"
	rd.resetStats(t)
	before := plainCounts(ss)
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range stores * goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := ss[g%stores]
			for range each {
				d := check(t, s, store.Request{Key: key, Params: p, Cost: 1})
				switch {
				case d.Allowed:
					admitted.Add(1)
				case d.Reason == sluice.ReasonLimited && d.Remaining == 0 && d.RetryAfter > 0:
					refused.Add(1)
				default:
					t.Errorf("refusal %+v, want ReasonLimited, 0 remaining and a retry after", d)
				}
			}
		}()
	}
	wg.Wait()
	for _, s := range ss {
		waitFollowUps(t, s)
	}
	if got := admitted.Load(); got != limit {
		t.Errorf("admitted %d of %d, want exactly %d", got, stores*goroutines*each, limit)
	}
	if got, want := plainCounts(ss).sub(before), [2]uint64{stores * goroutines * each, 0}; got != want {
		t.Errorf("PlainChecks: %v plain and by script, want %v", got, want)
	}
	if got, want := (plainCount{reported[0].Load(), reported[1].Load()}), plainCounts(ss); got != want {
		t.Errorf("OnPlain reported %v plain and by script, PlainChecks %v", got, want)
	}
	stats := rd.stats(t)
	// Every check a plain HINCRBY; a refusal given back by a script each
	// (an EVALSHA, and an EVAL after those Redis answered NOSCRIPT, before
	// it had the script); the window's first count given its expiry by
	// two PEXPIREAT (NX, GT) and the previous window's field dropped.
	if want := int(refused.Load()); stats["evalsha"] != want || stats["eval"] > stores*goroutines || stats["pexpireat"] != 2 || stats["hdel"] != 1 {
		t.Errorf("commands %v, want %d EVALSHA, 2 PEXPIREAT and 1 HDEL", stats, want)
	}
	h, err := rd.do(t, key, "HGETALL", key)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d\n%d", time.Now().UnixMicro()/(1000*3600e6)*1000*3600e6, limit); h != want {
		t.Errorf("HGETALL = %s, want %s", h, want)
	}
	if ttl, err := rd.do(t, key, "PTTL", key); err != nil || ttl == "-1" || ttl == "-2" {
		t.Errorf("PTTL = %s, %v: want the window's expiry", ttl, err)
	}
}

// TestPlainResetDuringRefusals resets a key at its limit again and again
// while goroutines are refused on it: no count ever goes negative, and
// once every refusal is given back the key holds at most its limit and a
// time to live (or is absent).
func TestPlainResetDuringRefusals(t *testing.T) {
	testPlainResetDuringRefusals(t, standaloneRedis(t))
}

func testPlainResetDuringRefusals(t *testing.T, rd plainRedis) {
	s := newStore(t, Config{Addrs: rd.addrs})
	waitClock(t, s)
	const limit = 3
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: 1000 * time.Hour})
	const key = "rl:plain:reset"
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				check(t, s, store.Request{Key: key, Params: p, Cost: 1})
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	bad := ""
	for bad == "" && time.Now().Before(deadline) {
		if err := s.Reset(ctx, key); err != nil {
			bad = err.Error()
		}
		for range 5 {
			v, err := rd.do(t, key, "HVALS", key)
			if err != nil {
				bad = err.Error()
			}
			for _, f := range strings.Fields(v) {
				if n, err := strconv.Atoi(f); err != nil || n < 0 {
					bad = "count " + f
				}
			}
		}
	}
	close(stop)
	wg.Wait()
	if bad != "" {
		t.Fatalf("%s: want a count of 0 or more", bad)
	}
	waitFollowUps(t, s)
	v, _ := rd.do(t, key, "HVALS", key)
	for _, f := range strings.Fields(v) {
		if n, err := strconv.Atoi(f); err != nil || n < 0 || n > limit {
			t.Errorf("count left %q, want 0 to %d", f, limit)
		}
	}
	if ttl, err := rd.do(t, key, "PTTL", key); err != nil || ttl == "-1" {
		t.Errorf("PTTL = %s, %v: want an expiry or no key", ttl, err)
	}
}

// TestPlainLaterWindow checks that a check at Redis' clock of a key
// holding a later window (written by a request ahead of Redis' clock,
// which the scripts write as a string, not a hash) is decided by the
// script, against that window, as on every store.
func TestPlainLaterWindow(t *testing.T) { testPlainLaterWindow(t, standaloneRedis(t)) }

func testPlainLaterWindow(t *testing.T, rd plainRedis) {
	s := newStore(t, Config{Addrs: rd.addrs})
	waitClock(t, s)
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour})
	for _, c := range []struct {
		name string
		r    store.Request
	}{
		{"after", store.Request{Params: p, Cost: 3, After: 2 * time.Hour}},
		{"explicit instant", store.Request{Params: p, Cost: 3, Now: time.Now().Add(2 * time.Hour)}},
	} {
		key := "rl:plain:later:" + c.name
		c.r.Key = key
		if d := check(t, s, c.r); !d.Allowed {
			t.Fatalf("%s: %+v, want admitted", c.name, d)
		}
		if typ, err := rd.do(t, key, "TYPE", key); err != nil || typ != "string" {
			t.Errorf("%s: TYPE %s, %v: want string", c.name, typ, err)
		}
		d := check(t, s, store.Request{Key: key, Params: p, Cost: 1})
		if d.Allowed || d.Reason != sluice.ReasonLimited {
			t.Errorf("%s: at Redis' clock: %+v, want refused against the later window", c.name, d)
		}
	}
}

// TestPlainCommands shows by INFO commandstats that a fixed window's check
// of cost 1 at Redis' clock is one HINCRBY and nothing else on the wire,
// alone and in a batch of 10, once its window has its first count.
func TestPlainCommands(t *testing.T) { testPlainCommands(t, standaloneRedis(t)) }

func testPlainCommands(t *testing.T, rd plainRedis) {
	s := newStore(t, Config{Addrs: rd.addrs})
	waitClock(t, s)
	ctx := context.Background()
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 100, Window: time.Hour})
	var reqs []store.Request
	for i := range 10 {
		reqs = append(reqs, store.Request{Key: fmt.Sprintf("rl:plain:ten:%d", i), Params: p, Cost: 1})
	}
	out := make([]sluice.Decision, len(reqs))
	if err := s.Check(ctx, reqs, out); err != nil { // the windows' first counts
		t.Fatal(err)
	}
	waitFollowUps(t, s)
	for _, n := range []int{1, 10} {
		stats := rd.measure(t, func() {
			if err := s.Check(ctx, reqs[:n], out); err != nil {
				t.Fatal(err)
			}
		})
		delete(stats, "time") // the store's reading of Redis' clock, every second
		if want := map[string]int{"hincrby": n}; !maps.Equal(stats, want) {
			t.Errorf("%d checks: %v, want %v", n, stats, want)
		}
		for i, d := range out[:n] {
			if !d.Allowed || d.Remaining >= 99 {
				t.Errorf("%d checks: check %d %+v, want admitted", n, i, d)
			}
		}
	}
}

// TestPlainMatchesScript decides one sequence of checks at Redis' clock
// on a store that sends fixed windows plain and on one with ScriptsOnly:
// alike, for a window that counts refused requests or not, costs above
// the limit and reads (which go to the script) included.
func TestPlainMatchesScript(t *testing.T) { testPlainMatchesScript(t, standaloneRedis(t)) }

func testPlainMatchesScript(t *testing.T, rd plainRedis) {
	plain := newStore(t, Config{Addrs: rd.addrs, Prefix: "plain:"})
	scripts := newStore(t, Config{Addrs: rd.addrs, Prefix: "scripts:", ScriptsOnly: true})
	waitClock(t, plain)
	for _, counting := range []bool{false, true} {
		p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 4, Window: time.Hour})
		p.CountRefused = counting
		key := fmt.Sprintf("rl:match:%v", counting)
		for i, cost := range []int64{1, 2, 0, 1, 1, 5, 1, 0, 1} {
			r := store.Request{Key: key, Params: p, Cost: cost}
			got, want := check(t, plain, r), check(t, scripts, r)
			waitFollowUps(t, plain)
			if got.Allowed != want.Allowed || got.Reason != want.Reason || got.Remaining != want.Remaining ||
				(got.RetryAfter > 0) != (want.RetryAfter > 0) || got.ResetAfter <= 0 || got.ResetAfter > time.Hour {
				t.Errorf("counting refused %v, check %d (cost %d): plain %+v, script %+v", counting, i, cost, got, want)
			}
		}
		a, _ := rd.do(t, "plain:"+key, "HVALS", "plain:"+key)
		b, _ := rd.do(t, "scripts:"+key, "HVALS", "scripts:"+key)
		if a != b {
			t.Errorf("counting refused %v: count %q, want %q as the script's", counting, a, b)
		}
	}
}

// plainCounts are the sums of PlainChecks over stores: plain, by script.
type plainCount [2]uint64

func plainCounts(ss []*Store) (n plainCount) {
	for _, s := range ss {
		p, sc := s.PlainChecks()
		n[0] += p
		n[1] += sc
	}
	return n
}

func (n plainCount) sub(m plainCount) plainCount { return plainCount{n[0] - m[0], n[1] - m[1]} }

// TestClusterSlotMovePlain moves the slot of one identity to another
// master while two stores race plain fixed-window checks of cost 1 on its
// keys, limits reached included. A check whose key has left the source
// (ASK) or whose slot has moved (MOVED) is refused by the node before it
// runs, and decided again by the script wherever the key is: no check
// fails, each key admits exactly min(its limit, the checks made on it),
// and Redis holds exactly what was admitted once the refusals are given
// back.
func TestClusterSlotMovePlain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	ss := []*Store{newStore(t, Config{Addrs: c.Addrs()}), newStore(t, Config{Addrs: c.Addrs()})}
	for _, s := range ss {
		waitClock(t, s)
	}
	const keys, limit = 20, 100
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: 1000 * time.Hour})
	key := func(i int) string { return "rl:plainmove:{user=7}:k" + strconv.Itoa(i%keys) }
	var tried, admitted [keys]atomic.Int64
	var errs atomic.Int64
	var lastErr atomic.Value
	before := plainCounts(ss)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		s := ss[w%len(ss)]
		wg.Go(func() {
			out := make([]sluice.Decision, 1)
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				err := s.Check(ctx, []store.Request{{Key: key(i), Params: p, Cost: 1}}, out)
				cancel()
				if err != nil {
					errs.Add(1)
					lastErr.Store(err.Error())
					continue
				}
				tried[i%keys].Add(1)
				if out[0].Allowed {
					admitted[i%keys].Add(1)
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	m := startSlotMove(t, c, key(0))
	for m.migrate(2) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	m.finish()
	moved := plainCounts(ss)
	time.Sleep(300 * time.Millisecond)
	after := plainCounts(ss).sub(moved)
	close(stop)
	wg.Wait()
	for _, s := range ss {
		waitFollowUps(t, s)
	}
	if n := errs.Load(); n > 0 {
		t.Errorf("%d checks failed during the move, last: %v", n, lastErr.Load())
	}
	for i := range keys {
		k := key(i)
		want := min(limit, tried[i].Load())
		if got := admitted[i].Load(); got != want {
			t.Errorf("%s: admitted %d of %d checks, want exactly %d", k, got, tried[i].Load(), want)
		}
		v, err := m.dst.Do("HVALS", k)
		if err != nil {
			t.Fatal(err)
		}
		if v != strconv.FormatInt(want, 10) {
			t.Errorf("%s: count %q in Redis, want %d", k, v, want)
		}
	}
	n := plainCounts(ss).sub(before)
	if n[0] == 0 || n[1] == 0 {
		t.Errorf("PlainChecks: %d plain, %d by script: want both (the script after ASK and MOVED)", n[0], n[1])
	}
	// Once a check has met the MOVED, the slot map is read again: the
	// checks go plain to the new master.
	if after[0] == 0 {
		t.Errorf("after the move: %d checks plain, %d by script: want plain ones", after[0], after[1])
	}
	t.Logf("%d checks decided plain, %d by the script; after the move %d and %d", n[0], n[1], after[0], after[1])
}

// TestClusterFailoverPlain kills a master of a cluster with replicas
// while plain fixed-window checks run on its keys: while it is down they
// fail (as its scripts would) or are decided; once its replica is
// promoted, they are decided again, plain again on the new master (the
// slot map read again once the dead master's estimate has aged, the new
// master's clock started by its first check), and the slot map no longer
// names the dead master, whose clock is then no longer read.
func TestClusterFailoverPlain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster with replicas, and waits for a failover")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{Replicas: 1})
	// A replica that has never synchronized cannot be promoted; Redis
	// waits 5 s before its first synchronization by default.
	for _, m := range c.Masters {
		if _, err := m.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range c.Replicas {
		for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
			info, err := r.Info("replication")
			if err == nil && info["master_link_status"] == "up" {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("replica %s not synchronized: %v %v", r.Addr, info, err)
			}
		}
	}
	s := newStore(t, Config{Addrs: c.Addrs()})
	waitClock(t, s)
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1_000_000, Window: time.Hour})
	dead := c.Masters[0]
	var keys []string // keys on the master to kill
	for i := 0; len(keys) < 5; i++ {
		k := fmt.Sprintf("rl:failover:{user=%d}", i)
		if owner(t, c, k) == dead {
			keys = append(keys, k)
		}
	}
	round := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		reqs := make([]store.Request, len(keys))
		for i, k := range keys {
			reqs[i] = store.Request{Key: k, Params: p, Cost: 1}
		}
		return s.Check(ctx, reqs, make([]sluice.Decision, len(reqs)))
	}
	if err := round(); err != nil {
		t.Fatal(err)
	}
	dead.Kill()
	killed := time.Now()
	failed := 0
	var decided time.Duration // since the kill, when the checks were decided again
	for {
		err := round()
		if err == nil && decided == 0 {
			decided = time.Since(killed)
		}
		if err == nil {
			before, _ := s.PlainChecks()
			if err = round(); err == nil {
				if after, _ := s.PlainChecks(); after-before == uint64(len(keys)) {
					break // decided, and plain
				}
			}
		}
		if err != nil {
			if !errors.Is(err, sluice.ErrStoreUnavailable) {
				t.Fatalf("Check during the failover: %v, want an error wrapping ErrStoreUnavailable", err)
			}
			failed++
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("no plain check on the new master within 30 s (%d calls failed; last error %v)", failed, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	plainAgain := time.Since(killed)
	t.Logf("checks decided again %s after the kill, plain again %s after; %d calls failed meanwhile", decided.Round(time.Millisecond), plainAgain.Round(time.Millisecond), failed)
	m := s.slots.Load()
	for _, ms := range m.masters {
		if ms.addr == dead.Addr {
			t.Fatalf("the slot map still names the dead master %s", dead.Addr)
		}
	}
}

// TestPlainClusterTLS checks that on a cluster whose nodes speak TLS the
// store finds each master's node under the address the slot map gives it
// (the TLS port), so that fixed-window checks go plain there too.
func TestPlainClusterTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	pki := redistest.NewPKI(t)
	c := redistest.StartCluster(t, redistest.ClusterOptions{TLS: &redistest.TLSOptions{PKI: pki, AuthClients: true}})
	ca, err := os.ReadFile(pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(pki.ClientCertFile, pki.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Config{Addrs: c.TLSAddrs(), TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}},
		DialTimeout: 10 * time.Second}) // a TLS handshake under -race on a busy machine
	waitClock(t, s) // fails when a master's node is unknown under its address
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 10, Window: time.Hour})
	for i := range 10 {
		check(t, s, store.Request{Key: fmt.Sprintf("rl:tls:{user=%d}", i), Params: p, Cost: 1})
	}
	if plain, script := s.PlainChecks(); plain != 10 || script != 0 {
		t.Errorf("PlainChecks: %d plain, %d by script; want 10 plain", plain, script)
	}
}
