package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyspace"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

var t0 = storetest.T0

func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func compile(t testing.TB, l sluice.Limit) *algorithm.Params {
	t.Helper()
	p, err := algorithm.Compile(l)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

func check(t testing.TB, s *Store, r store.Request) sluice.Decision {
	t.Helper()
	out := make([]sluice.Decision, 1)
	if err := s.Check(context.Background(), []store.Request{r}, out); err != nil {
		t.Fatalf("Check(%s): %v", r.Key, err)
	}
	return out[0]
}

func TestConformanceStandalone(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, func(t *testing.T) storetest.Store {
		return newStore(t, Config{Addrs: []string{srv.Addr}})
	})
}

// TestClusterNodeDown checks that a Check whose keys span the masters,
// one of them killed, decides the keys of the others and names the rest in
// a *store.PartialError, instead of failing them all.
func TestClusterNodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	// A long node timeout: the other masters go on serving their slots
	// while the test runs, as they do until a failure is agreed on.
	c := redistest.StartCluster(t, redistest.ClusterOptions{NodeTimeout: 30 * time.Second})
	s := newStore(t, Config{Addrs: c.Addrs()})
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour})
	var reqs []store.Request
	for i := range 30 {
		reqs = append(reqs, store.Request{Key: fmt.Sprintf("rl:down:{user=%d}:x", i), Params: p, Cost: 1, Now: t0})
	}
	out := make([]sluice.Decision, len(reqs))
	ctx := context.Background()
	if err := s.Check(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	dead := c.Masters[0]
	onDead := onNode(dead, reqs)
	if len(onDead) == 0 || len(onDead) == len(reqs) {
		t.Fatalf("%d of %d keys on the master to kill", len(onDead), len(reqs))
	}
	dead.Kill()

	clear(out)
	err := s.Check(ctx, reqs, out)
	var pe *store.PartialError
	if !errors.As(err, &pe) || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("Check with a master down: %v, want a *store.PartialError wrapping ErrStoreUnavailable", err)
	}
	failed := map[int]bool{}
	for _, i := range pe.Failed {
		failed[i] = true
	}
	for i := range reqs {
		switch {
		case onDead[i] != failed[i]:
			t.Errorf("request %d: on the killed master %v, reported failed %v", i, onDead[i], failed[i])
		case !failed[i] && (!out[i].Allowed || out[i].Remaining != 1):
			t.Errorf("request %d on a live master: %+v, want allowed with 1 remaining", i, out[i])
		}
	}
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	open := func(t testing.TB) *Store {
		s := newStore(t, Config{Addrs: c.Addrs()})
		if !s.Cluster() {
			t.Fatal("store does not see a cluster")
		}
		return s
	}
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Store { return open(t) })
	})
	t.Run("KeysSpread", func(t *testing.T) {
		s := open(t)
		p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 10, Window: time.Minute})
		for i := range 60 {
			check(t, s, store.Request{Key: fmt.Sprintf("rl:spread:{user=%d}:x", i), Params: p, Cost: 1})
		}
		for _, m := range c.Masters {
			n, err := m.Do("DBSIZE")
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := strconv.Atoi(n); v == 0 {
				t.Errorf("master %s holds no key", m.Addr)
			}
		}
	})
	t.Run("BatchAcrossSlots", func(t *testing.T) {
		s := open(t)
		ctx := context.Background()
		p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour})
		var reqs []store.Request
		slots := map[uint16]bool{}
		for i := range 10 {
			k := fmt.Sprintf("rl:across:{user=%d}:x", i)
			slots[slotOf(k)] = true
			reqs = append(reqs, store.Request{Key: k, Params: p, Cost: 1, Now: t0})
		}
		if len(slots) < 5 {
			t.Fatalf("keys on %d slots only", len(slots))
		}
		out := make([]sluice.Decision, len(reqs))
		// Check: each key on its own.
		if err := s.Check(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out {
			if !d.Allowed || d.Remaining != 2 {
				t.Fatalf("Check %d: %+v, want allowed, 2 remaining", i, d)
			}
		}
		// Exhaust one key: CheckAll over all is denied and consumes nothing.
		ex := reqs[7]
		ex.Cost = 2
		check(t, s, ex)
		if err := s.CheckAll(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out {
			switch {
			case d.Allowed:
				t.Errorf("CheckAll %d allowed: %+v", i, d)
			case i == 7 && d.Remaining != 0:
				t.Errorf("CheckAll %d (exhausted): %+v", i, d)
			case i != 7 && (d.Remaining != 2 || d.Reason != sluice.ReasonLimited || d.RetryAfter != 0):
				t.Errorf("CheckAll %d: %+v, want limited with 2 remaining and no retry", i, d)
			}
		}
		// Without the exhausted key, CheckAll admits and consumes all.
		rest := append(append([]store.Request(nil), reqs[:7]...), reqs[8:]...)
		if err := s.CheckAll(ctx, rest, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out[:len(rest)] {
			if !d.Allowed || d.Remaining != 1 {
				t.Errorf("CheckAll rest %d: %+v, want allowed with 1 remaining", i, d)
			}
		}
	})
	t.Run("CheckAllOnce", func(t *testing.T) {
		testCheckAllOnce(t, open(t), open(t))
	})
	t.Run("CheckAllOnceCorruptRecord", func(t *testing.T) {
		testCheckAllOnceCorruptRecord(t, open(t))
	})
	t.Run("CheckAllOnceRecordRefused", func(t *testing.T) {
		testOnceAcrossRecordRefused(t, c, open(t))
	})
	t.Run("CheckAllOnceRecordsPastDeadline", func(t *testing.T) {
		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
		testCheckAllOnceRecordsPastDeadline(t, rc, open(t))
	})
	t.Run("CheckAllOnceRecordsAfterASlowBatch", func(t *testing.T) {
		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
		testCheckAllOnceRecordsAfterASlowBatch(t, rc, open(t))
	})
	t.Run("RoundTrips", func(t *testing.T) {
		s := open(t)
		p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 100, Window: time.Minute})
		var reqs []store.Request
		for i := range 10 {
			reqs = append(reqs, store.Request{Key: fmt.Sprintf("rl:rt:{user=7}:r%d", i), Params: p, Cost: 1})
		}
		check(t, s, reqs[0]) // load the script on its node
		var node *redistest.Server
		for _, m := range c.Masters {
			if n, _ := m.Do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(int(slotOf(reqs[0].Key)))); n != "0" && n != "" {
				node = m
			}
		}
		if node == nil {
			t.Fatal("no master holds the key")
		}
		for _, m := range c.Masters {
			m.Do("CONFIG", "RESETSTAT")
		}
		out := make([]sluice.Decision, len(reqs))
		if err := s.CheckAll(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
		stats := commandStats(t, node)
		if stats["evalsha"] != 1 || stats["eval"] != 0 {
			t.Errorf("a batch of 10 on one slot: %v, want exactly one EVALSHA", stats)
		}
	})
	t.Run("Exactness", func(t *testing.T) {
		stores := []storetest.Store{open(t), open(t), open(t), open(t)}
		for _, a := range sluice.Algorithms {
			p := compile(t, sluice.Limit{Algorithm: a, Limit: 100, Window: time.Hour})
			key := "rl:exact:{user=" + a.String() + "}"
			if got := storetest.Admitted(t, stores, key, p, 32, 4); got != 100 {
				t.Errorf("%s: 4 clients x 32 goroutines admitted %d of 512, want exactly 100", a, got)
			}
		}
	})
	t.Run("ScriptFlush", func(t *testing.T) {
		s := open(t)
		p := compile(t, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 3, Window: time.Hour})
		var reqs []store.Request
		for i := range 6 {
			reqs = append(reqs, store.Request{Key: fmt.Sprintf("rl:flush:{user=%d}", i), Params: p, Cost: 1, Now: t0})
		}
		out := make([]sluice.Decision, len(reqs))
		for round := range 2 {
			for _, m := range c.Masters {
				if _, err := m.Do("SCRIPT", "FLUSH"); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.CheckAll(context.Background(), reqs, out); err != nil {
				t.Fatalf("after SCRIPT FLUSH: %v", err)
			}
			for i, d := range out {
				if !d.Allowed || d.Remaining != int64(2-round) {
					t.Errorf("round %d request %d: %+v", round, i, d)
				}
			}
		}
	})
	t.Run("LongKeys", func(t *testing.T) {
		s := open(t)
		p := compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 2, Window: time.Hour})
		long := "rl:long:{user=9}:" + strings.Repeat("x", 10_000)
		reqs := []store.Request{{Key: long, Params: p, Cost: 1, Now: t0}, {Key: "rl:long:{user=9}:short", Params: p, Cost: 1, Now: t0}}
		out := make([]sluice.Decision, 2)
		for range 2 {
			if err := s.CheckAll(context.Background(), reqs, out); err != nil {
				t.Fatal(err)
			}
		}
		if !out[0].Allowed || out[0].Remaining != 0 {
			t.Errorf("long key: %+v, want allowed with 0 remaining", out[0])
		}
	})
}

// commandStats returns the calls of every command since CONFIG RESETSTAT,
// by lower-case name, leaving out the test's own INFO and CONFIG.
func commandStats(t *testing.T, s *redistest.Server) map[string]int {
	t.Helper()
	info, err := s.Info("commandstats")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for k, v := range info {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok || name == "info" || strings.HasPrefix(name, "config") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		m[name], _ = strconv.Atoi(calls)
	}
	return m
}

// measure returns the commands Redis ran for f, as commandStats. The
// client may still be opening a connection (HELLO) during the first calls;
// measure repeats f until a run is free of connection set-up, so the figure
// is the steady state of one call.
func measure(t *testing.T, srv *redistest.Server, f func()) map[string]int {
	t.Helper()
	for range 10 {
		if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		f()
		stats := commandStats(t, srv)
		if stats["hello"] == 0 {
			return stats
		}
	}
	t.Fatal("the client kept opening connections")
	return nil
}

// scriptCommands are the commands the scripts call inside their atomic
// step; INFO commandstats counts them too.
var scriptCommands = map[string]bool{
	"get": true, "set": true, "setrange": true, "del": true, "time": true, "pexpire": true,
	"zcard": true, "zcount": true, "zrange": true, "zadd": true, "zremrangebyscore": true,
	"hincrby": true, "hlen": true, "hdel": true, "hset": true, "hgetall": true,
}

// TestOneEvalshaPerCheck shows by INFO commandstats that one check is one
// EVALSHA and nothing else on the wire, for every algorithm, and that a
// batch of 10 on one server is one EVALSHA too, reading Redis' clock once
// (with ScriptsOnly; TestPlainCommands shows a fixed window's without).
func TestOneEvalshaPerCheck(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, ScriptsOnly: true})
	ctx := context.Background()
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 100, Window: time.Minute})
		r := store.Request{Key: "rl:one:" + a.String(), Params: p, Cost: 1}
		check(t, s, r) // the first call may load the script
		stats := measure(t, srv, func() { check(t, s, r) })
		if stats["evalsha"] != 1 {
			t.Errorf("%s: %d EVALSHA for one check, want 1 (%v)", a, stats["evalsha"], stats)
		}
		for name, n := range stats {
			if name != "evalsha" && !scriptCommands[name] {
				t.Errorf("%s: one check also sent %s x%d", a, name, n)
			}
		}

		var reqs []store.Request
		for i := range 10 {
			reqs = append(reqs, store.Request{Key: fmt.Sprintf("rl:ten:{k%d}:%s", i, a), Params: p, Cost: 1})
		}
		out := make([]sluice.Decision, len(reqs))
		if err := s.CheckAll(ctx, reqs, out); err != nil { // load the batch script
			t.Fatal(err)
		}
		for _, all := range []bool{false, true} {
			stats := measure(t, srv, func() {
				var err error
				if all {
					err = s.CheckAll(ctx, reqs, out)
				} else {
					err = s.Check(ctx, reqs, out)
				}
				if err != nil {
					t.Fatal(err)
				}
			})
			// On one server CheckAll and Check are one script call each.
			if stats["evalsha"] != 1 || stats["eval"] != 0 || stats["time"] != 1 {
				t.Errorf("%s: batch of 10 (all %v): %v, want 1 EVALSHA and 1 TIME", a, all, stats)
			}
		}
	}

	// After SCRIPT FLUSH the store loads the script again by itself.
	srv.Do("SCRIPT", "FLUSH")
	srv.Do("CONFIG", "RESETSTAT")
	p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 100, Window: time.Minute})
	if d := check(t, s, store.Request{Key: "rl:flushed", Params: p, Cost: 1}); !d.Allowed {
		t.Fatalf("after SCRIPT FLUSH: %+v", d)
	}
	if stats := commandStats(t, srv); stats["evalsha"] != 1 || stats["eval"] != 1 {
		t.Errorf("after SCRIPT FLUSH: %v, want one failed EVALSHA and one EVAL", stats)
	}
	srv.Do("CONFIG", "RESETSTAT")
	check(t, s, store.Request{Key: "rl:flushed", Params: p, Cost: 1})
	if stats := commandStats(t, srv); stats["evalsha"] != 1 || stats["eval"] != 0 {
		t.Errorf("after reloading: %v, want one EVALSHA", stats)
	}
}

// TestExactnessAcrossClients races 4 independent stores (4 clients, as 4
// instances would) with 32 goroutines each on one key, at one explicit
// instant: exactly the limit is admitted, for every algorithm.
func TestExactnessAcrossClients(t *testing.T) {
	srv := redistest.Start(t)
	const clients, goroutines, each, limit = 4, 32, 8, 300
	stores := make([]storetest.Store, clients)
	for i := range stores {
		stores[i] = newStore(t, Config{Addrs: []string{srv.Addr}})
	}
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			p := compile(t, sluice.Limit{Algorithm: a, Limit: limit, Window: time.Hour})
			key := "rl:exact:{k}:" + a.String()
			if got := storetest.Admitted(t, stores, key, p, goroutines, each); got != limit {
				t.Errorf("admitted %d of %d, want exactly %d", got, clients*goroutines*each, limit)
			}
		})
	}
}

// TestExactnessAcrossProcesses runs 4 processes (this test binary, started
// again in child mode) with 32 goroutines each against one key of one
// Redis, at one explicit instant: together they admit exactly the limit,
// for every algorithm.
func TestExactnessAcrossProcesses(t *testing.T) {
	const processes, goroutines, each, limit = 4, 32, 6, 250
	if addr := os.Getenv("SLUICE_EXACT_CHILD_ADDR"); addr != "" {
		exactChild(t, addr, os.Getenv("SLUICE_EXACT_CHILD_KEY"), goroutines, each, limit)
		return
	}
	if testing.Short() {
		t.Skip("starts 4 processes per algorithm")
	}
	srv := redistest.Start(t)
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			key := "rl:procs:{k}:" + a.String()
			cmds := make([]*exec.Cmd, processes)
			outs := make([]*strings.Builder, processes)
			for i := range cmds {
				cmd := exec.Command(os.Args[0], "-test.run=^TestExactnessAcrossProcesses$", "-test.count=1", "-test.v")
				cmd.Env = append(os.Environ(), "SLUICE_EXACT_CHILD_ADDR="+srv.Addr, "SLUICE_EXACT_CHILD_KEY="+key, "SLUICE_EXACT_CHILD_ALG="+a.String())
				outs[i] = &strings.Builder{}
				cmd.Stdout, cmd.Stderr = outs[i], outs[i]
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds[i] = cmd
			}
			var total int64
			for i, cmd := range cmds {
				if err := cmd.Wait(); err != nil {
					t.Fatalf("child %d: %v\n%s", i, err, outs[i])
				}
				_, after, ok := strings.Cut(outs[i].String(), "admitted=")
				n, err := strconv.ParseInt(strings.Fields(after + " ")[0], 10, 64)
				if !ok || err != nil {
					t.Fatalf("child %d printed no count:\n%s", i, outs[i])
				}
				total += n
			}
			if total != limit {
				t.Errorf("%d processes x %d goroutines admitted %d, want exactly %d", processes, goroutines, total, limit)
			}
		})
	}
}

// exactChild is the child side of TestExactnessAcrossProcesses.
func exactChild(t *testing.T, addr, key string, goroutines, each int, limit int64) {
	a, err := sluice.ParseAlgorithm(os.Getenv("SLUICE_EXACT_CHILD_ALG"))
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Config{Addrs: []string{addr}})
	p := compile(t, sluice.Limit{Algorithm: a, Limit: limit, Window: time.Hour})
	fmt.Printf("admitted=%d\n", storetest.Admitted(t, []storetest.Store{s}, key, p, goroutines, each))
}

func testCheckAllOnce(t *testing.T, s1, s2 *Store) {
	ctx := context.Background()
	p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 5, Window: time.Hour})
	for _, across := range []bool{false, true} {
		tag2 := "{user=1}"
		if across {
			tag2 = "{user=2}"
		}
		reqs := []store.Request{
			{Key: fmt.Sprintf("rl:once:%v:{user=1}:a", across), Params: p, Cost: 2, Now: t0},
			{Key: fmt.Sprintf("rl:once:%v:%s:b", across, tag2), Params: p, Cost: 1, Now: t0},
		}
		key := fmt.Sprintf("idem-%v", across)
		out := make([]sluice.Decision, 2)
		replayed, err := s1.CheckAllOnce(ctx, key, time.Minute, reqs, out)
		if err != nil || replayed {
			t.Fatalf("first: replayed %v, %v", replayed, err)
		}
		first := append([]sluice.Decision(nil), out...)
		if !first[0].Allowed || first[0].Remaining != 3 || first[1].Remaining != 4 {
			t.Fatalf("first: %+v", first)
		}
		// The repeat, from another instance, is replayed and charges nothing.
		replayed, err = s2.CheckAllOnce(ctx, key, time.Minute, reqs, out)
		if err != nil || !replayed {
			t.Fatalf("repeat: replayed %v, %v", replayed, err)
		}
		if out[0] != first[0] || out[1] != first[1] {
			t.Errorf("repeat: %+v, want %+v", out, first)
		}
		if d := check(t, s1, store.Request{Key: reqs[0].Key, Params: p, Now: t0}); d.Remaining != 3 {
			t.Errorf("after the repeat, remaining %d, want 3", d.Remaining)
		}
		// Another key decides again.
		if replayed, err = s2.CheckAllOnce(ctx, key+"-other", time.Minute, reqs, out); err != nil || replayed || out[0].Remaining != 1 {
			t.Errorf("other key: replayed %v, %v, %+v", replayed, err, out)
		}
	}
}

// lateClient is a client whose caller's context ends, once armed, as the
// record of an idempotency key is written (a SET of anything but the
// pending claim): the caller's deadline passes just after the batch was
// decided.
type lateClient struct {
	rueidis.Client
	armed  atomic.Bool
	cancel context.CancelFunc
}

func (c *lateClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if args := cmd.Commands(); len(args) > 2 && args[0] == "SET" && args[2] != pendingRecord && c.armed.CompareAndSwap(true, false) {
		c.cancel()
	}
	return c.Client.Do(ctx, cmd)
}

// testCheckAllOnceRecordsPastDeadline: a batch across slots is decided
// and charged, and its caller's deadline passes before the record is
// written. The record is written all the same: a retry with the key, from
// any instance, is replayed and charges nothing, instead of waiting for a
// record that never comes while the key stays claimed.
func testCheckAllOnceRecordsPastDeadline(t *testing.T, rc rueidis.Client, other *Store) {
	lc := &lateClient{Client: rc}
	s := newStore(t, Config{Client: lc})
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Hour})
	reqs := []store.Request{
		{Key: "rl:oncelate:{user=1}:a", Params: p, Cost: 2, Now: t0},
		{Key: "rl:oncelate:{user=2}:b", Params: p, Cost: 1, Now: t0},
	}
	out := make([]sluice.Decision, 2)
	ctx, cancel := context.WithCancel(context.Background())
	lc.cancel = cancel
	lc.armed.Store(true)
	if _, err := s.CheckAllOnce(ctx, "idem-late", time.Minute, reqs, out); err == nil && ctx.Err() == nil {
		t.Fatal("the caller's context did not end before the record")
	}
	for _, st := range []*Store{s, other} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		replayed, err := st.CheckAllOnce(ctx, "idem-late", time.Minute, reqs, out)
		cancel()
		if err != nil || !replayed || !out[0].Allowed || out[0].Remaining != 3 {
			t.Errorf("retry of a batch decided past its caller's deadline: replayed %v, %+v, %v; want the recorded decision (allowed, 3 remaining)", replayed, out[0], err)
		}
	}
	if d := check(t, other, store.Request{Key: reqs[0].Key, Params: p, Now: t0}); d.Remaining != 3 {
		t.Errorf("after the retries, remaining %d, want 3 (charged once)", d.Remaining)
	}
}

// slowClient is a client whose script calls, once armed, answer only
// after delay: a Redis slow to decide.
type slowClient struct {
	rueidis.Client
	armed atomic.Bool
	delay time.Duration
}

func (c *slowClient) slow(cmds ...rueidis.Completed) {
	for _, cmd := range cmds {
		if name := cmd.Commands()[0]; c.armed.Load() && (name == "EVALSHA" || name == "EVAL") {
			time.Sleep(c.delay)
			return
		}
	}
}

func (c *slowClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.slow(cmd)
	return c.Client.Do(ctx, cmd)
}

func (c *slowClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.slow(cmds...)
	return c.Client.DoMulti(ctx, cmds...)
}

// testCheckAllOnceRecordsAfterASlowBatch: a batch across slots whose
// decision takes longer than the store's timeout, within its caller's
// deadline, is decided and charged; its record must then be written, so
// that a retry is replayed and charges nothing instead of waiting on the
// claim and being charged again once it expires.
func testCheckAllOnceRecordsAfterASlowBatch(t *testing.T, rc rueidis.Client, other *Store) {
	sc := &slowClient{Client: rc, delay: 150 * time.Millisecond}
	s := newStore(t, Config{Client: sc, Timeout: 100 * time.Millisecond})
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Hour})
	reqs := []store.Request{
		{Key: "rl:onceslow:{user=1}:a", Params: p, Cost: 2, Now: t0},
		{Key: "rl:onceslow:{user=2}:b", Params: p, Cost: 1, Now: t0},
	}
	out := make([]sluice.Decision, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	sc.armed.Store(true)
	replayed, err := s.CheckAllOnce(ctx, "idem-slow", time.Minute, reqs, out)
	sc.armed.Store(false)
	cancel()
	if err != nil || replayed || !out[0].Allowed || out[0].Remaining != 3 {
		t.Fatalf("a batch decided in 150ms with a store timeout of 100ms and a 3s deadline: replayed %v, %+v, %v; want decided (allowed, 3 remaining)", replayed, out[0], err)
	}
	for _, st := range []*Store{s, other} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		replayed, err := st.CheckAllOnce(ctx, "idem-slow", time.Minute, reqs, out)
		cancel()
		if err != nil || !replayed || !out[0].Allowed || out[0].Remaining != 3 {
			t.Errorf("retry of a batch decided slowly: replayed %v, %+v, %v; want the recorded decision (allowed, 3 remaining)", replayed, out[0], err)
		}
	}
	if d := check(t, other, store.Request{Key: reqs[0].Key, Params: p, Now: t0}); d.Remaining != 3 {
		t.Errorf("after the retries, remaining %d, want 3 (charged once)", d.Remaining)
	}
}

func TestCheckAllOnceStandalone(t *testing.T) {
	srv := redistest.Start(t)
	testCheckAllOnce(t, newStore(t, Config{Addrs: []string{srv.Addr}}), newStore(t, Config{Addrs: []string{srv.Addr}}))
	testCheckAllOnceCorruptRecord(t, newStore(t, Config{Addrs: []string{srv.Addr}}))
}

// testCheckAllOnceCorruptRecord puts values of other types and unreadable
// strings under idempotency keys: the batch is decided as for a new key
// and its record replaces the value, on one slot and across slots alike,
// rather than every check with that key failing.
func testCheckAllOnceCorruptRecord(t *testing.T, s *Store) {
	ctx := context.Background()
	c := s.client
	p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 5, Window: time.Hour})
	for _, across := range []bool{false, true} {
		for _, bad := range []struct {
			name string
			put  func(key string) rueidis.Completed
		}{
			{"list", func(k string) rueidis.Completed { return c.B().Rpush().Key(k).Element("x").Build() }},
			{"hash", func(k string) rueidis.Completed { return c.B().Hset().Key(k).FieldValue().FieldValue("f", "v").Build() }},
			{"garbage", func(k string) rueidis.Completed { return c.B().Set().Key(k).Value("garbage").Build() }},
			// Two admitted decisions with 9 remaining, and a field that is
			// not a whole number: unreadable as a whole, not read around.
			{"a field not a number", func(k string) rueidis.Completed {
				return c.B().Set().Key(k).Value("1,0,9,0,0,1,0,9,0,0,x").Build()
			}},
			{"an empty field", func(k string) rueidis.Completed {
				return c.B().Set().Key(k).Value("1,0,9,0,0,1,0,9,0,,0").Build()
			}},
			{"a number in exponent form", func(k string) rueidis.Completed {
				return c.B().Set().Key(k).Value("1,0,9e0,0,0,1,0,9,0,0").Build()
			}},
		} {
			tag2 := "{user=1}"
			if across {
				tag2 = "{user=2}"
			}
			name := fmt.Sprintf("%s-%v", bad.name, across)
			reqs := []store.Request{
				{Key: "rl:oncebad:" + name + ":{user=1}:a", Params: p, Cost: 2, Now: t0},
				{Key: "rl:oncebad:" + name + ":" + tag2 + ":b", Params: p, Cost: 1, Now: t0},
			}
			key := "idem-bad-" + name
			rec := key // where the store keeps the record
			if s.cluster && !across {
				rec = keyspace.OnSlot(slotOf(reqs[0].Key), key)
			}
			if err := c.Do(ctx, bad.put(rec)).Error(); err != nil {
				t.Fatal(err)
			}
			out := make([]sluice.Decision, 2)
			replayed, err := s.CheckAllOnce(ctx, key, time.Minute, reqs, out)
			if err != nil || replayed || !out[0].Allowed || out[0].Remaining != 3 {
				t.Errorf("%s: replayed %v, %v, %+v, want decided as new", name, replayed, err, out)
				continue
			}
			first := append([]sluice.Decision(nil), out...)
			replayed, err = s.CheckAllOnce(ctx, key, time.Minute, reqs, out)
			if err != nil || !replayed || out[0] != first[0] || out[1] != first[1] {
				t.Errorf("%s, repeat: replayed %v, %v, %+v, want %+v replayed", name, replayed, err, out, first)
			}
		}
	}
}

// TestCorruptState puts wrong data under keys and checks that the store
// resets it with a warning and a count, and decides as for a new key.
func TestCorruptState(t *testing.T) {
	srv := redistest.Start(t)
	var reported atomic.Int64
	var logged strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(b)
	}), nil))
	s := newStore(t, Config{Addrs: []string{srv.Addr}, Logger: logger, OnCorrupt: func(n int) { reported.Add(int64(n)) }})
	corruptions := []struct {
		name string
		cmd  []string // KEY stands for the key
	}{
		{"list", []string{"RPUSH", "KEY", "a", "b"}},
		{"hash", []string{"HSET", "KEY", "tokens", "5"}},
		{"garbage", []string{"SET", "KEY", "not a number"}},
		{"old format", []string{"SET", "KEY", "5:1700000000"}},
		{"out of range", []string{"SET", "KEY", "1:99999999999999999999:0:0"}},
		{"string for a log", []string{"SET", "KEY", "1:2:3:4"}},
		// Sorted sets whose scores the store never writes: instants
		// beyond what a Lua number counts exactly, or not whole quanta.
		{"log entry at infinity", []string{"ZADD", "KEY", "+inf", "x"}},
		{"log entry far ahead", []string{"ZADD", "KEY", "1e20", "x"}},
		{"log entry beyond 2^53", []string{"ZADD", "KEY", "9007199254740994", "x"}},
		{"log entry between quanta", []string{"ZADD", "KEY", strconv.FormatInt(t0.UnixMicro(), 10) + ".5", "x"}},
	}
	want := uint64(0)
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 5, Window: time.Minute})
		for _, c := range corruptions {
			forLog := c.name == "string for a log" || strings.HasPrefix(c.name, "log entry")
			if forLog && a != sluice.SlidingWindowLog {
				continue
			}
			key := "rl:corrupt:" + a.String() + ":" + c.name
			args := append([]string(nil), c.cmd...)
			args[1] = key
			if _, err := srv.Do(args...); err != nil {
				t.Fatal(err)
			}
			d := check(t, s, store.Request{Key: key, Params: p, Cost: 2, Now: t0})
			if !d.Allowed || d.Remaining != 3 {
				t.Errorf("%s, %s: %+v, want allowed as a new key", a, c.name, d)
			}
			want++
			if got := s.CorruptResets(); got != want {
				t.Errorf("%s, %s: CorruptResets %d, want %d", a, c.name, got, want)
			}
			// The state is sound again.
			if d := check(t, s, store.Request{Key: key, Params: p, Cost: 3, Now: t0}); !d.Allowed || d.Remaining != 0 {
				t.Errorf("%s, %s, second check: %+v, want allowed with 0 remaining", a, c.name, d)
			}
			// And it expires.
			if pttl, _ := srv.Do("PTTL", key); pttl == "-1" {
				t.Errorf("%s, %s: the key has no time to live", a, c.name)
			}
		}
	}
	// Corrupt keys in a batch, decided by the batch script.
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Minute})
	lp := compile(t, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 5, Window: time.Minute})
	srv.Do("SET", "rl:corrupt:batch:a", "garbage")
	srv.Do("HSET", "rl:corrupt:batch:b", "f", "v")
	reqs := []store.Request{{Key: "rl:corrupt:batch:a", Params: p, Cost: 1, Now: t0}, {Key: "rl:corrupt:batch:b", Params: lp, Cost: 1, Now: t0}}
	out := make([]sluice.Decision, 2)
	if err := s.CheckAll(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	want += 2
	if !out[0].Allowed || out[0].Remaining != 4 || !out[1].Allowed || out[1].Remaining != 4 || s.CorruptResets() != want {
		t.Errorf("batch with corrupt keys: %+v, %d resets, want both allowed with 4 remaining, %d resets", out, s.CorruptResets(), want)
	}
	if got := uint64(reported.Load()); got != want {
		t.Errorf("OnCorrupt reported %d, want %d", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), "corrupt") {
		t.Errorf("no warning logged: %q", logged.String())
	}
}

// TestOutOfRangeState puts states of the right layout whose numbers no
// check writes (a negative count, debt or instant, a count beyond any limit
// the store accepts, a third field where the algorithm keeps two) under
// keys, and checks that both scripts reset and count them as corrupt, and
// decide as for a new key. A negative count used to pass: a fixed window
// at -1 admitted 6 of its 5.
func TestOutOfRangeState(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	// t0 starts a minute, so it is the start of its fixed window and
	// sliding window counter window.
	at := strconv.FormatInt(t0.UnixMicro(), 10)
	const above = "2251799813685249" // 2^51 + 1
	for _, tc := range []struct {
		alg    sluice.Algorithm
		states []string
	}{
		{sluice.TokenBucket, []string{"1:-1:" + at + ":0", "1:0:-1:0", "1:" + above + ":" + at + ":0", "1:0:" + at + ":1"}},
		{sluice.LeakyBucket, []string{"1:-1:" + at + ":0", "1:0:-1:0", "1:" + above + ":" + at + ":0", "1:0:" + at + ":1"}},
		{sluice.GCRA, []string{"1:-1:0:0", "1:" + at + ":-1:0", "1:" + at + ":" + above + ":0", "1:" + at + ":0:1"}},
		{sluice.FixedWindow, []string{"1:-60000000:1:0", "1:" + at + ":-1:0", "1:" + at + ":" + above + ":0", "1:" + at + ":1:1"}},
		{sluice.SlidingWindowCounter, []string{"1:-60000000:1:0", "1:" + at + ":-1:0", "1:" + at + ":0:-1", "1:" + at + ":" + above + ":0", "1:" + at + ":0:" + above}},
	} {
		p := compile(t, sluice.Limit{Algorithm: tc.alg, Limit: 5, Window: time.Minute})
		for _, st := range tc.states {
			// Check sends one check to checkeach.lua, CheckAll to check.lua.
			for _, via := range []string{"Check", "CheckAll"} {
				key := "rl:range:" + tc.alg.String() + ":" + via + ":" + st
				if _, err := srv.Do("SET", key, st); err != nil {
					t.Fatal(err)
				}
				before := s.CorruptResets()
				r := []store.Request{{Key: key, Params: p, Cost: 2, Now: t0}}
				out := checkVia(t, s, via, r)
				if d := out[0]; !d.Allowed || d.Remaining != 3 {
					t.Errorf("%s %s %q: %+v, want allowed as a new key", via, tc.alg, st, d)
				}
				if got := s.CorruptResets() - before; got != 1 {
					t.Errorf("%s %s %q: %d corrupt resets, want 1", via, tc.alg, st, got)
				}
			}
		}
	}
	// A log entry before the epoch.
	p := compile(t, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 5, Window: time.Minute})
	for _, via := range []string{"Check", "CheckAll"} {
		key := "rl:range:log:" + via
		if _, err := srv.Do("ZADD", key, "-1", "x"); err != nil {
			t.Fatal(err)
		}
		before := s.CorruptResets()
		r := []store.Request{{Key: key, Params: p, Cost: 2, Now: time.UnixMicro(30_000_000)}}
		out := checkVia(t, s, via, r)
		if d := out[0]; !d.Allowed || d.Remaining != 3 {
			t.Errorf("%s log entry at -1: %+v, want allowed as a new key", via, d)
		}
		if got := s.CorruptResets() - before; got != 1 {
			t.Errorf("%s log entry at -1: %d corrupt resets, want 1", via, got)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestExpiry checks each key's time to live against algorithm.ExpiresAt,
// and that denials and reads write nothing.
func TestExpiry(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, ExpiryMargin: 500 * time.Millisecond})
	for _, a := range sluice.Algorithms {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 4, Window: time.Minute})
		key := "rl:ttl:" + a.String()
		// A read and a request above the capacity create nothing.
		check(t, s, store.Request{Key: key, Params: p, Cost: 0, Now: t0})
		check(t, s, store.Request{Key: key, Params: p, Cost: 9, Now: t0})
		if n, _ := srv.Do("EXISTS", key); n != "0" {
			t.Errorf("%s: a read or an impossible request created the key", a)
		}
		check(t, s, store.Request{Key: key, Params: p, Cost: 4, Now: t0})
		var st algorithm.State
		switch a {
		case sluice.SlidingWindowLog:
			st.A = t0.UnixMicro() / p.Quantum
		default:
			st, _ = algorithm.Apply(p, st, t0.UnixMicro(), 4)
		}
		wantMS := (algorithm.ExpiresAt(p, st)-t0.UnixMicro())/1000 + 500
		pttl, err := srv.Do("PTTL", key)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := strconv.ParseInt(pttl, 10, 64)
		if got > wantMS || got < wantMS-2000 {
			t.Errorf("%s: PTTL %d ms, want about %d", a, got, wantMS)
		}
		// A denial leaves the value and the expiry alone.
		before, _ := srv.Do("DUMP", key)
		time.Sleep(5 * time.Millisecond)
		if d := check(t, s, store.Request{Key: key, Params: p, Cost: 1, Now: t0.Add(time.Millisecond)}); d.Allowed {
			t.Fatalf("%s: allowed past the limit", a)
		}
		after, _ := srv.Do("DUMP", key)
		pttl2, _ := srv.Do("PTTL", key)
		got2, _ := strconv.ParseInt(pttl2, 10, 64)
		if before != after || got2 > got {
			t.Errorf("%s: a denial changed the key (ttl %d -> %d)", a, got, got2)
		}
	}
}

// TestExpiryOfStateSharedByPriorities checks that a key decided with
// several Params sharing its state (a rule's priority variants) lives until
// every one of them sees it restored, on both scripts: 10 units at normal
// priority (10/s) and one at high (12/s) leave 11 units of debt, which the
// normal refill takes 1.1 s to restore, not the 0.92 s of the high one.
func TestExpiryOfStateSharedByPriorities(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, ExpiryMargin: time.Millisecond})
	for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyBucket} {
		ps := []algorithm.Params{
			*compile(t, sluice.Limit{Algorithm: a, Limit: 10, Window: time.Second}),
			*compile(t, sluice.Limit{Algorithm: a, Limit: 12, Window: time.Second}),
		}
		algorithm.ShareState(ps)
		normal, high := &ps[0], &ps[1]
		// Check (checkeach.lua) on one key, CheckAll (check.lua) on another.
		// The keys' time to live is what the scripts set: that the state
		// then decides as a key never seen is algorithm.ExpiresAt's test.
		each, all := "rl:prio:"+a.String()+":{each}", "rl:prio:"+a.String()+":{all}"
		checkAll := func(r store.Request) sluice.Decision {
			t.Helper()
			out := make([]sluice.Decision, 1)
			if err := s.CheckAll(context.Background(), []store.Request{r}, out); err != nil {
				t.Fatalf("CheckAll(%s): %v", r.Key, err)
			}
			return out[0]
		}
		start := time.Now()
		for _, d := range []sluice.Decision{
			check(t, s, store.Request{Key: each, Params: normal, Cost: 10, Now: start}),
			check(t, s, store.Request{Key: each, Params: high, Cost: 1, Now: start}),
			checkAll(store.Request{Key: all, Params: normal, Cost: 10, Now: start}),
			checkAll(store.Request{Key: all, Params: high, Cost: 1, Now: start}),
		} {
			if !d.Allowed {
				t.Fatalf("%s: a normal burst and one unit at high priority: %+v", a, d)
			}
		}
		for _, k := range []string{each, all} {
			pttl, err := srv.Do("PTTL", k)
			if err != nil {
				t.Fatal(err)
			}
			// 1,100 ms and the 1 ms margin, less the time the calls took
			// (and 1 ms of rounding); the high refill alone would give 918.
			if got, _ := strconv.ParseInt(pttl, 10, 64); got < 1100-time.Since(start).Milliseconds() {
				t.Errorf("%s %s: PTTL %d ms, want the 1,100 ms of the normal refill", a, k, got)
			}
		}
	}
}

// TestUnavailable checks that a dead or slow Redis gives a prompt error
// wrapping sluice.ErrStoreUnavailable.
func TestUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 5, Window: time.Minute})
	req := []store.Request{{Key: "rl:down", Params: p, Cost: 1}}
	out := make([]sluice.Decision, 1)
	if err := s.Check(context.Background(), req, out); err != nil {
		t.Fatal(err)
	}

	// Slow: the server sleeps longer than the deadline.
	go srv.Do("DEBUG", "SLEEP", "2")
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	start := time.Now()
	err := s.Check(ctx, req, out)
	cancel()
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("slow Redis: got %v, want ErrStoreUnavailable", err)
	}
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Errorf("slow Redis: answered after %s, want about the 200ms deadline", el)
	}

	// Dead.
	srv.Kill()
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	err = s.Check(ctx, req, out)
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("dead Redis: got %v, want ErrStoreUnavailable", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("dead Redis: answered after %s", el)
	}
	if err := s.Reset(ctx, "rl:down"); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("dead Redis, Reset: got %v", err)
	}
	s.Close()
	if err := s.Check(context.Background(), req, out); !errors.Is(err, ErrClosed) {
		t.Errorf("closed: got %v, want ErrClosed", err)
	}
}

func TestRedisKey(t *testing.T) {
	long := "rl:r:{user=42}:" + strings.Repeat("y", 1000)
	k := redisKey("p:", long, 512)
	if len(k) > 128 || !strings.HasPrefix(k, "p:{user=42}#") {
		t.Errorf("redisKey(long) = %q", k)
	}
	if slotOf(k) != slotOf("p:rl:r:{user=42}:short") {
		t.Error("a hashed key left its identity's slot")
	}
	if redisKey("p:", long+"z", 512) == k {
		t.Error("two long keys share a hashed form")
	}
	longTag := "rl:{" + strings.Repeat("t", 1000) + "}"
	k1, k2 := redisKey("", longTag+"a", 512), redisKey("", longTag+"b", 512)
	if k1 == k2 || slotOf(k1) != slotOf(k2) || len(k1) > 128 {
		t.Errorf("long tags: %q, %q", k1, k2)
	}
	if got := redisKey("p:", "short", 512); got != "p:short" {
		t.Errorf("redisKey(short) = %q", got)
	}
}

// TestHashedKeyWithLongTagKeepsItsSlot checks that a key too long to be
// written as is, whose hash tag is too long to be kept (a long user id, an
// e-mail address), stays on the slot of its identity's short keys, so that
// a batch of that identity stays one script call on one slot.
func TestHashedKeyWithLongTagKeepsItsSlot(t *testing.T) {
	for _, n := range []int{65, 70, 200, 450} {
		user := strings.Repeat("u", n-len("user="))
		short := "rl:orders:tb.1m0s:{user=" + user + "}:endpoint=/api"
		long := "rl:orders:tb.1m0s:{user=" + user + "}:endpoint=/api/" + strings.Repeat("x", 600)
		ks, kl := redisKey("", short, DefaultMaxKeyLength), redisKey("", long, DefaultMaxKeyLength)
		if ks != short || len(kl) > 128 {
			t.Errorf("tag of %d bytes: redisKey(short) = %q, redisKey(long) = %q", n, ks, kl)
		}
		if slotOf(ks) != slotOf(kl) {
			t.Errorf("tag of %d bytes: keys of one identity on different slots: %q on %d, %q on %d", n, ks, slotOf(ks), kl, slotOf(kl))
		}
	}
}

func TestParseURL(t *testing.T) {
	cases := []struct {
		in      string
		addrs   []string
		db      int
		user    string
		pass    string
		tls     bool
		master  string
		wantErr string
	}{
		{in: "redis://localhost:6380", addrs: []string{"localhost:6380"}},
		{in: "redis://localhost", addrs: []string{"localhost:6379"}},
		{in: "redis://u:p%40ss@h:1/3", addrs: []string{"h:1"}, db: 3, user: "u", pass: "p@ss"},
		{in: "rediss://h:2", addrs: []string{"h:2"}, tls: true},
		{in: "redis-cluster://a:1,b:2,c:3", addrs: []string{"a:1", "b:2", "c:3"}},
		{in: "redis-cluster://a:1/2", wantErr: "no database"},
		{in: "redis://a:1,b:2", wantErr: "redis-cluster"},
		{in: "redis://h:x", wantErr: "port"},
		{in: "redis://h/x", wantErr: "database"},
		{in: "memcache://h", wantErr: "scheme"},
		{in: "redis://:secret@h:1/", addrs: []string{"h:1"}, pass: "secret"},
		// IPv6 addresses, in brackets, with and without a port.
		{in: "redis://[::1]/0", addrs: []string{"[::1]:6379"}},
		{in: "redis://[::1]:6380", addrs: []string{"[::1]:6380"}},
		{in: "redis-cluster://[fd00::1],[fd00::2]:7000", addrs: []string{"[fd00::1]:6379", "[fd00::2]:7000"}},
		{in: "redis://[]", wantErr: "empty host"},
		// A password holding an unescaped '/', '?' or '#' is refused
		// without being quoted; escaped, it is read.
		{in: "redis://:se/cret@h:1", wantErr: "percent-escape"},
		{in: "redis://u:se?cret@h:1/2", wantErr: "percent-escape"},
		{in: "redis://:se#cret@h", wantErr: "percent-escape"},
		{in: "redis://:se%2Fcr%23et@h:1/2", addrs: []string{"h:1"}, db: 2, pass: "se/cr#et"},
		// Sentinels: the port defaults to 26379, the master's name follows
		// the hosts, and a database number may follow it.
		{in: "redis-sentinel://s1,s2:26380/mymaster", addrs: []string{"s1:26379", "s2:26380"}, master: "mymaster"},
		{in: "redis-sentinel://u:p@[::1]/m/4", addrs: []string{"[::1]:26379"}, master: "m", db: 4, user: "u", pass: "p"},
		{in: "redis-sentinel://:secret@s1:26379", wantErr: "names its master"},
		{in: "redis-sentinel://s1/", wantErr: "names its master"},
		{in: "redis-sentinel://s1/m/", wantErr: "database"},
		{in: "redis-sentinel://s1/m/x", wantErr: "database"},
		{in: "redis-sentinel://s1/m/1/2", wantErr: "database"},
		{in: "redis-sentinel://s1:0/m", wantErr: "port"},
		{in: "redis-sentinel://s1/m?db=1", wantErr: "query"},
	}
	for _, c := range cases {
		cfg, err := ParseURL(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("ParseURL(%q): %v, want an error about %s", c.in, err, c.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "cret") {
				t.Errorf("ParseURL(%q): %v shows the password", c.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseURL(%q): %v", c.in, err)
			continue
		}
		if fmt.Sprint(cfg.Addrs) != fmt.Sprint(c.addrs) || cfg.DB != c.db || cfg.Username != c.user || cfg.Password != c.pass || (cfg.TLS != nil) != c.tls || cfg.MasterSet != c.master {
			t.Errorf("ParseURL(%q) = %+v", c.in, cfg)
		}
	}
}

// owner returns the master of c that holds key's slot.
func owner(t *testing.T, c *redistest.Cluster, key string) *redistest.Server {
	t.Helper()
	for _, m := range c.Masters {
		if _, err := m.Do("EXISTS", key); err == nil {
			return m
		}
	}
	t.Fatalf("no master holds %s", key)
	return nil
}

// testOnceAcrossRecordRefused runs an idempotent batch across slots whose
// record the record's node refuses to write once the batch is decided (its
// user loses the right to SET meanwhile, as a node failing over or an
// instance dying at that point would leave it): the claim must not lock
// the key for the record's whole time to live, so that a repeat a few
// seconds later is decided.
func testOnceAcrossRecordRefused(t *testing.T, c *redistest.Cluster, s *Store) {
	const key = "idem-record-refused"
	recNode := owner(t, c, key)
	p := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 5, Window: time.Hour})
	var reqs []store.Request
	slots := map[uint16]bool{}
	for i := 0; len(reqs) < 2; i++ {
		k := fmt.Sprintf("rl:refused:{user=%d}:x", i)
		if owner(t, c, k) != recNode && !slots[slotOf(k)] {
			slots[slotOf(k)] = true
			reqs = append(reqs, store.Request{Key: k, Params: p, Cost: 2, Now: t0})
		}
	}
	batchNode := owner(t, c, reqs[0].Key)
	// The batch's node sleeps 300ms: the claim is made at once, SET is
	// refused on the record's node from 150ms, and the batch is decided at
	// 300ms.
	var wg sync.WaitGroup
	wg.Go(func() { batchNode.Do("DEBUG", "SLEEP", "0.3") })
	wg.Go(func() {
		time.Sleep(150 * time.Millisecond)
		if _, err := recNode.Do("ACL", "SETUSER", "default", "-set"); err != nil {
			t.Error(err)
		}
	})
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	out := make([]sluice.Decision, 2)
	_, err := s.CheckAllOnce(ctx, key, 5*time.Minute, reqs, out)
	cancel()
	wg.Wait()
	if _, err := recNode.Do("ACL", "SETUSER", "default", "+set"); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("the record was written: the test did not refuse it")
	}
	claimTTL, _ := recNode.Do("PTTL", key)
	t.Logf("first call: %v; the claim's time to live then %s ms", err, claimTTL)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	replayed, err := s.CheckAllOnce(ctx, key, 5*time.Minute, reqs, out)
	if err != nil {
		t.Fatalf("repeat: %v after %s; the key stays claimed (time to live %s ms)", err, time.Since(start).Round(time.Millisecond), claimTTL)
	}
	t.Logf("repeat: replayed %v, %+v, after %s", replayed, out[0], time.Since(start).Round(time.Millisecond))
}

// slotMove moves the slot of a key from its master to another by hand, as
// redis-cli --cluster reshard does: CLUSTER SETSLOT IMPORTING and
// MIGRATING, MIGRATE of its keys a few at a time, then SETSLOT NODE on
// every master. While some of its keys have moved and others not, Redis
// refuses a command naming keys on both nodes with TRYAGAIN.
type slotMove struct {
	t        *testing.T
	c        *redistest.Cluster
	slot     string
	src, dst *redistest.Server
}

// startSlotMove marks the slot of key as moving from its master to another.
func startSlotMove(t *testing.T, c *redistest.Cluster, key string) *slotMove {
	t.Helper()
	m := &slotMove{t: t, c: c, slot: strconv.Itoa(int(slotOf(key))), src: owner(t, c, key)}
	for _, s := range c.Masters {
		if s != m.src {
			m.dst = s
			break
		}
	}
	m.do(m.dst, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.id(m.src))
	m.do(m.src, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.id(m.dst))
	return m
}

func (m *slotMove) do(s *redistest.Server, args ...string) string {
	v, err := s.Do(args...)
	if err != nil {
		m.t.Errorf("%s: %v", strings.Join(args, " "), err)
	}
	return v
}

func (m *slotMove) id(s *redistest.Server) string {
	return strings.TrimSpace(m.do(s, "CLUSTER", "MYID"))
}

// migrate moves up to n keys of the slot to the destination and returns
// how many it moved.
func (m *slotMove) migrate(n int) int {
	ks := strings.Fields(m.do(m.src, "CLUSTER", "GETKEYSINSLOT", m.slot, strconv.Itoa(n)))
	if len(ks) > 0 {
		m.do(m.src, append([]string{"MIGRATE", "127.0.0.1", strconv.Itoa(m.dst.Port), "", "0", "5000", "KEYS"}, ks...)...)
	}
	return len(ks)
}

// finish moves the keys left and gives the slot to the destination.
func (m *slotMove) finish() {
	for m.migrate(100) > 0 {
	}
	for _, s := range m.c.Masters {
		m.do(s, "CLUSTER", "SETSLOT", m.slot, "NODE", m.id(m.dst))
	}
}

// isTryAgain reports whether err is Redis' TRYAGAIN refusal, wrapped as a
// store error.
func isTryAgain(err error) bool {
	return errors.Is(err, sluice.ErrStoreUnavailable) && strings.Contains(err.Error(), "TRYAGAIN")
}

// TestClusterSlotMove moves the slot of one identity to another master
// while calls naming its keys run, of every kind: Check of one key, Check
// of four keys of the slot, CheckAll of three keys of the slot and one of
// another (two phases across slots), and CheckAllOnce of four keys of the
// slot (the record on the slot too). A call of one key follows the ASK and
// MOVED redirections; a call of several keys, which Redis refuses with
// TRYAGAIN while they lie on both nodes, is sent again until they lie on
// one. Every call is decided within its deadline, and what was admitted is
// exactly what Redis counted.
func TestClusterSlotMove(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	var reported atomic.Int64
	s := newStore(t, Config{Addrs: c.Addrs(), OnTryAgain: func(n int) { reported.Add(int64(n)) }})
	const limit, keys, others = 100_000, 50, 5
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: 1000 * time.Hour})
	key := func(i int) string { return "rl:move:{user=7}:k" + strconv.Itoa(i%keys) }
	other := func(i int) string { return "rl:move:{user=8}:k" + strconv.Itoa(i%others) }
	if slotOf(key(0)) == slotOf(other(0)) {
		t.Fatal("the two identities share a slot")
	}
	kinds := [...]string{"Check of one key", "Check of 4 keys", "CheckAll across slots", "CheckAllOnce"}
	var admitted atomic.Int64
	var calls, errs [len(kinds)]atomic.Int64
	var lastErr [len(kinds)]atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 * len(kinds) {
		kind := w % len(kinds)
		wg.Go(func() {
			out := make([]sluice.Decision, 4)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				reqs := []store.Request{{Key: key(i), Params: p, Cost: 1}}
				if kind > 0 {
					for j := 1; j < 4; j++ {
						reqs = append(reqs, store.Request{Key: key(i + 13*j), Params: p, Cost: 1})
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				var err error
				replayed := false
				switch kind {
				case 0, 1:
					err = s.Check(ctx, reqs, out)
				case 2:
					reqs[3].Key = other(i)
					err = s.CheckAll(ctx, reqs, out)
				case 3:
					// Few record keys, which expire soon: the slot keeps
					// few keys to move, and batches are decided anew.
					replayed, err = s.CheckAllOnce(ctx, fmt.Sprintf("move-%d-%d", w, i%10), 100*time.Millisecond, reqs, out)
				}
				cancel()
				calls[kind].Add(1)
				if err != nil {
					errs[kind].Add(1)
					lastErr[kind].Store(err.Error())
					continue
				}
				for j := range reqs {
					if out[j].Allowed && !replayed {
						admitted.Add(1)
					}
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	m := startSlotMove(t, c, key(0))
	// A few keys at a time, so that calls meet the slot half moved.
	for m.migrate(5) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	m.finish()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	for k, name := range kinds {
		if n := errs[k].Load(); n > 0 {
			t.Errorf("%s: %d of %d calls failed during the move, last: %v", name, n, calls[k].Load(), lastErr[k].Load())
		}
	}
	retries := s.TryAgainRetries()
	if retries == 0 {
		t.Error("no call was refused with TRYAGAIN: the calls did not meet the slot split")
	}
	if got := reported.Load(); got != int64(retries) {
		t.Errorf("OnTryAgain reported %d calls sent again, TryAgainRetries %d", got, retries)
	}
	var counted int64
	out := make([]sluice.Decision, 1)
	for i := range keys + others {
		k := key(i)
		if i >= keys {
			k = other(i)
		}
		if err := s.Check(context.Background(), []store.Request{{Key: k, Params: p}}, out); err != nil {
			t.Fatal(err)
		}
		counted += limit - out[0].Remaining
	}
	if got, want := counted, admitted.Load(); got != want {
		t.Errorf("Redis counted %d units, the calls admitted %d", got, want)
	}
	if n, _ := m.src.Do("CLUSTER", "COUNTKEYSINSLOT", m.slot); n != "0" {
		t.Errorf("the source still holds %s keys of the slot, want 0", n)
	}
	t.Logf("admitted %d units in %v calls; %d calls sent again after TRYAGAIN while the slot was split", admitted.Load(), func() (n [len(kinds)]int64) {
		for k := range n {
			n[k] = calls[k].Load()
		}
		return n
	}(), retries)
}

// TestClusterSlotSplitPastDeadline holds a slot split between two masters
// (two of its four keys moved): script calls naming its four keys, of
// every kind, are refused by Redis with TRYAGAIN and sent again until
// their deadline is near, then fail with the TRYAGAIN refusal, having
// written nothing; a call made during the split with a deadline longer
// than the split is decided once the slot has moved. A Check of the four
// keys as plain fixed-window checks is decided during the split, each key
// once: a command per key, run by the source for the keys not moved, and
// refused there with ASK, then decided by the script on the destination,
// for the others.
func TestClusterSlotSplitPastDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	s := newStore(t, Config{Addrs: c.Addrs(), ScriptsOnly: true})
	plain := newStore(t, Config{Addrs: c.Addrs()})
	waitClock(t, plain)
	const limit = 1000
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: 1000 * time.Hour})
	var reqs []store.Request
	for i := range 4 {
		reqs = append(reqs, store.Request{Key: "rl:split:{user=7}:k" + strconv.Itoa(i), Params: p, Cost: 1})
	}
	across := append(slices.Clone(reqs[:3]), store.Request{Key: "rl:split:{user=8}:k", Params: p, Cost: 1})
	if slotOf(across[3].Key) == slotOf(reqs[0].Key) {
		t.Fatal("the two identities share a slot")
	}
	count := func() (n []int64) {
		out := make([]sluice.Decision, 1)
		for _, r := range append(slices.Clone(reqs), across[3]) {
			if err := s.Check(context.Background(), []store.Request{{Key: r.Key, Params: p}}, out); err != nil {
				t.Fatal(err)
			}
			n = append(n, limit-out[0].Remaining)
		}
		return n
	}
	out := make([]sluice.Decision, 4)
	if err := s.Check(context.Background(), append(slices.Clone(reqs), across[3]), make([]sluice.Decision, 5)); err != nil {
		t.Fatal(err)
	}
	// The deadline, from a reference taken in the same run: at least
	// 500ms, and 20 times the slowest of 5 round trips, so that on a
	// loaded machine (round trips of 100ms and more) the calls are still
	// sent again several times before their reserve, twice the longest
	// round trip, is all that is left.
	var slowest time.Duration
	for range 5 {
		start := time.Now()
		if err := s.Check(context.Background(), []store.Request{{Key: across[3].Key, Params: p}}, make([]sluice.Decision, 1)); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, time.Since(start))
	}
	deadline := max(500*time.Millisecond, 20*slowest)

	m := startSlotMove(t, c, reqs[0].Key)
	if n := m.migrate(2); n != 2 {
		t.Fatalf("moved %d keys, want 2", n)
	}
	for _, call := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"Check", func(ctx context.Context) error { return s.Check(ctx, reqs, out) }},
		{"CheckAll", func(ctx context.Context) error { return s.CheckAll(ctx, reqs, out) }},
		{"CheckAll across slots", func(ctx context.Context) error { return s.CheckAll(ctx, across, out) }},
		{"CheckAllOnce", func(ctx context.Context) error {
			_, err := s.CheckAllOnce(ctx, "split", time.Minute, reqs, out)
			return err
		}},
	} {
		var err error
		var took time.Duration
		var retries uint64
		// A first refusal that comes back past the deadline (one round
		// trip of over 500ms: the process or Redis left without CPU for
		// that long) leaves nothing to send again: such a call is made
		// again, twice at most, and the last one is judged.
		for range 3 {
			before := s.TryAgainRetries()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			start := time.Now()
			err = call.f(ctx)
			took = time.Since(start)
			cancel()
			retries = s.TryAgainRetries() - before
			if retries > 0 || took < deadline {
				break
			}
			t.Logf("%s: %v after %s, sent once: the first answer came past the deadline; again", call.name, err, took.Round(time.Millisecond))
		}
		if !isTryAgain(err) {
			t.Errorf("%s during a split longer than its deadline: %v, want TRYAGAIN wrapping ErrStoreUnavailable", call.name, err)
		}
		// Pauses of 1, 2, 4, ... ms, until a tenth of the deadline (or
		// twice the longest round trip, on a busy machine) remains.
		if retries < 2 || took < deadline/4 {
			t.Errorf("%s: sent again %d times, failed after %s of its %s: want it sent again until near its deadline", call.name, retries, took, deadline)
		}
		t.Logf("%s: %v after %s, sent again %d times", call.name, err, took.Round(time.Millisecond), retries)
	}
	if got, want := count(), []int64{1, 1, 1, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("counts after the refused calls: %v, want %v (nothing written)", got, want)
	}

	// Plain checks of the four keys: decided during the split.
	before, _ := plain.PlainChecks()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	err := plain.Check(ctx, reqs, out)
	cancel()
	if err != nil {
		t.Fatalf("plain Check during the split: %v", err)
	}
	for i, d := range out {
		if !d.Allowed || d.Remaining != limit-2 {
			t.Errorf("plain Check during the split, request %d: %+v, want admitted with %d remaining", i, d, limit-2)
		}
	}
	if after, _ := plain.PlainChecks(); after-before != 2 {
		t.Errorf("plain Check during the split: %d decided plain, want 2 (the keys not moved)", after-before)
	}
	if got, want := count(), []int64{2, 2, 2, 2, 1}; !slices.Equal(got, want) {
		t.Errorf("counts after the plain Check: %v, want %v", got, want)
	}

	// A deadline longer than the split: decided once the slot has moved.
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- s.Check(ctx, reqs, out)
	}()
	time.Sleep(100 * time.Millisecond)
	m.finish()
	if err := <-done; err != nil {
		t.Fatalf("Check during a split shorter than its deadline: %v", err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("Check decided after %s, before the slot moved", took)
	}
	for i, d := range out {
		if !d.Allowed || d.Remaining != limit-3 {
			t.Errorf("request %d: %+v, want admitted with %d remaining", i, d, limit-3)
		}
	}
	replayed, err := s.CheckAllOnce(context.Background(), "split", time.Minute, reqs, out)
	if err != nil || replayed {
		t.Fatalf("CheckAllOnce after the move: replayed %v, %v; want decided (no record written while refused)", replayed, err)
	}
	if got, want := count(), []int64{4, 4, 4, 4, 1}; !slices.Equal(got, want) {
		t.Errorf("counts after the move: %v, want %v", got, want)
	}
}

// TestClusterCheckParts checks that CheckParts reports every request once,
// decided as Check decides it, on a standalone server and on a cluster,
// and that with one master of a cluster killed or stopped (SIGSTOP: it
// answers nothing, as a host that froze or dropped off the network), the
// requests of the live masters are reported decided before the stopped
// master's fail, at the deadline.
func TestClusterCheckParts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 3, Window: time.Hour})
	reqsOf := func(name string) []store.Request {
		var reqs []store.Request
		for i := range 30 {
			key := fmt.Sprintf("rl:parts-%s:{user=%d}:x", name, i)
			reqs = append(reqs, store.Request{Key: key, Params: p, Cost: 1, Now: t0})
			if i%5 == 0 { // a key twice: the second sees the first
				reqs = append(reqs, store.Request{Key: key, Params: p, Cost: 1, Now: t0})
			}
		}
		return reqs
	}
	// parts runs CheckParts and returns, per request, how often it was
	// reported, its error and when it was reported.
	type report struct {
		times int
		err   error
		at    time.Time
	}
	parts := func(t *testing.T, s *Store, ctx context.Context, reqs []store.Request, out []sluice.Decision) []report {
		t.Helper()
		got := make([]report, len(reqs))
		err := s.CheckParts(ctx, reqs, out, func(idx []int, err error) {
			now := time.Now()
			for _, i := range idx {
				got[i].times++
				got[i].err, got[i].at = err, now
			}
		})
		if err != nil {
			t.Fatalf("CheckParts: %v", err)
		}
		for i, r := range got {
			if r.times != 1 {
				t.Errorf("request %d reported %d times, want once", i, r.times)
			}
		}
		return got
	}
	same := func(t *testing.T, s *Store, name string) {
		reqs := reqsOf(name)
		for round := range 2 { // the second round sees the first's counts
			// Check decides a copy of the keys, CheckParts the keys.
			out, want := make([]sluice.Decision, len(reqs)), make([]sluice.Decision, len(reqs))
			for i := range reqs {
				reqs[i].Key += "!"
			}
			if err := s.Check(context.Background(), reqs, want); err != nil {
				t.Fatal(err)
			}
			for i := range reqs {
				reqs[i].Key = strings.TrimSuffix(reqs[i].Key, "!")
			}
			for i, r := range parts(t, s, context.Background(), reqs, out) {
				if r.err != nil || out[i] != want[i] {
					t.Errorf("round %d, request %d: %+v, %v; want %+v as Check decided", round, i, out[i], r.err, want[i])
				}
			}
		}
	}
	t.Run("Standalone", func(t *testing.T) {
		srv := redistest.Start(t)
		same(t, newStore(t, Config{Addrs: []string{srv.Addr}}), "standalone")
	})
	t.Run("Cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, redistest.ClusterOptions{})
		same(t, newStore(t, Config{Addrs: c.Addrs()}), "cluster")
	})
	for _, how := range []string{"killed", "stopped"} {
		t.Run("Master"+how, func(t *testing.T) {
			c := redistest.StartCluster(t, redistest.ClusterOptions{NodeTimeout: 30 * time.Second})
			s := newStore(t, Config{Addrs: c.Addrs()})
			reqs := reqsOf(how)
			out := make([]sluice.Decision, len(reqs))
			if err := s.Check(context.Background(), reqs, out); err != nil {
				t.Fatal(err)
			}
			dead := c.Masters[0]
			onDead := onNode(dead, reqs)
			if len(onDead) == 0 || len(onDead) == len(reqs) {
				t.Fatalf("%d of %d keys on the master to stop", len(onDead), len(reqs))
			}
			if how == "killed" {
				dead.Kill()
			} else {
				if err := dead.Process().Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { dead.Process().Signal(syscall.SIGCONT) })
			}
			const deadline = time.Second // long, for a busy machine
			start := time.Now()          // before the deadline is set
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(deadline))
			defer cancel()
			got := parts(t, s, ctx, reqs, out)
			var lastLive, firstDead, lastDead time.Time
			for i, r := range got {
				switch {
				case onDead[i] && !errors.Is(r.err, sluice.ErrStoreUnavailable):
					t.Errorf("request %d, on the %s master: %+v, %v; want an error", i, how, out[i], r.err)
				case !onDead[i] && (r.err != nil || out[i].Remaining != 0 && out[i].Remaining != 1):
					t.Errorf("request %d, on a live master: %+v, %v; want decided", i, out[i], r.err)
				}
				if onDead[i] {
					if firstDead.IsZero() || r.at.Before(firstDead) {
						firstDead = r.at
					}
					if r.at.After(lastDead) {
						lastDead = r.at
					}
				} else if r.at.After(lastLive) {
					lastLive = r.at
				}
			}
			t.Logf("live masters' requests reported after %s, the %s master's after %s to %s",
				lastLive.Sub(start), how, firstDead.Sub(start), lastDead.Sub(start))
			if how == "stopped" {
				if !lastLive.Before(firstDead) {
					t.Errorf("a live master's request was reported %s after the stopped master's failed: it waited for the stopped master", lastLive.Sub(firstDead))
				}
				if d := lastDead.Sub(start); d < deadline || d > deadline+time.Second {
					t.Errorf("the stopped master's requests failed after %s, want at the deadline of %s", d, deadline)
				}
			}
		})
	}
}

// onNode returns the indexes of the requests whose keys lie on a slot that
// node serves (its keys were written by an earlier check).
func onNode(node *redistest.Server, reqs []store.Request) map[int]bool {
	on := map[int]bool{}
	for i, r := range reqs {
		if n, err := node.Do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(int(slotOf(r.Key)))); err == nil && n != "0" {
			on[i] = true
		}
	}
	return on
}

// checkVia decides reqs through s.Check or s.CheckAll, as via names, and
// returns the decisions.
func checkVia(t *testing.T, s *Store, via string, reqs []store.Request) []sluice.Decision {
	t.Helper()
	out := make([]sluice.Decision, len(reqs))
	do := s.Check
	if via == "CheckAll" {
		do = s.CheckAll
	}
	if err := do(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWindowsInPlace checks the common call of a fixed window or a sliding
// window counter, every check at one set, one cost and Redis' clock, which
// checkeach.lua counts in place for a key of the current window with room
// left and decides in full otherwise: a key named several times sees its
// earlier checks, refusals, and keys absent, of another type, in the text
// layout or with a count that is not an integer all decide as single
// checks would.
// A fixed window's checks go as plain commands too (plain.go), but for
// those the script decides again; their reset after then differs by the
// round trips between.
func TestWindowsInPlace(t *testing.T) {
	for _, scripts := range []bool{true, false} {
		t.Run(fmt.Sprintf("scripts only %v", scripts), func(t *testing.T) { windowsInPlace(t, scripts) })
	}
}

func windowsInPlace(t *testing.T, scriptsOnly bool) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, ScriptsOnly: scriptsOnly})
	var slack time.Duration
	if !scriptsOnly {
		waitClock(t, s)
		slack = time.Second
	}
	ctx := context.Background()
	for n, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter} {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 3, Window: time.Hour})
		pre := a.String() + ":"
		if _, err := srv.Do("RPUSH", pre+"list", "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Do("SET", pre+"text", "1:0:1:0"); err != nil {
			t.Fatal(err)
		}
		// the binary layout with a count of 1.5
		if _, err := srv.Do("SET", pre+"half", "\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xf8\x3f\x00\x00\x00\x00\x00\x00\x00\x00"); err != nil {
			t.Fatal(err)
		}
		keys := []string{"a", "b", "a", "list", "a", "text", "half", "a"}
		want := [][]int64{ // remaining per check, -1 for a refusal
			{2, 2, 1, 2, 0, 2, 2, -1},
			{-1, 1, -1, 1, -1, 1, 1, -1},
			{-1, 0, -1, 0, -1, 0, 0, -1},
			{-1, -1, -1, -1, -1, -1, -1, -1},
		}
		for round, w := range want {
			reqs := make([]store.Request, len(keys))
			for i, k := range keys {
				reqs[i] = store.Request{Key: pre + k, Params: p, Cost: 1}
			}
			out := make([]sluice.Decision, len(reqs))
			if err := s.Check(ctx, reqs, out); err != nil {
				t.Fatal(err)
			}
			for i, d := range out {
				got := d.Remaining
				if !d.Allowed {
					got = -1
					if d.Reason != sluice.ReasonLimited || d.RetryAfter <= 0 {
						t.Errorf("%s round %d, check %d (%s): refused %+v, want ReasonLimited and a retry after", a, round, i, keys[i], d)
					}
				}
				if got != w[i] {
					t.Errorf("%s round %d, check %d (%s): remaining %d, want %d (%+v)", a, round, i, keys[i], got, w[i], d)
				}
				if diff := d.ResetAfter - out[0].ResetAfter; diff < -slack || diff > slack || d.ResetAfter <= 0 || d.ResetAfter > 2*time.Hour {
					t.Errorf("%s round %d, check %d (%s): reset after %v, want %v as the first check's, within two hours", a, round, i, keys[i], d.ResetAfter, out[0].ResetAfter)
				}
			}
		}
		if got, want := s.CorruptResets(), uint64(2*(n+1)); got != want {
			t.Errorf("%s: CorruptResets = %d, want %d (a list and a count of 1.5 each)", a, got, want)
		}
	}
}

// TestBucketsInline checks the common call of the bucket algorithms and
// GCRA, every check at one set, one cost and Redis' clock, which
// checkeach.lua decides inline for a key absent or valid with room left,
// and in full otherwise: a key named several times sees its earlier
// checks, and refusals and keys of another type or in the text layout
// decide as single checks would.
func TestBucketsInline(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	ctx := context.Background()
	for n, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		bucketsInline(t, ctx, srv, s, a)
		if got, want := s.CorruptResets(), uint64(n+1); got != want {
			t.Errorf("%s: CorruptResets = %d, want %d (a list each)", a, got, want)
		}
	}
}

func bucketsInline(t *testing.T, ctx context.Context, srv *redistest.Server, s *Store, a sluice.Algorithm) {
	p := compile(t, sluice.Limit{Algorithm: a, Limit: 3, Window: time.Hour})
	pre := a.String() + ":"
	if _, err := srv.Do("RPUSH", pre+"list", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("SET", pre+"text", "1:0:0:0"); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "b", "a", "list", "a", "text", "a"}
	want := [][]int64{ // remaining per check, -1 for a refusal
		{2, 2, 1, 2, 0, 2, -1},
		{-1, 1, -1, 1, -1, 1, -1},
	}
	for round, w := range want {
		reqs := make([]store.Request, len(keys))
		for i, k := range keys {
			reqs[i] = store.Request{Key: pre + k, Params: p, Cost: 1}
		}
		out := make([]sluice.Decision, len(reqs))
		if err := s.Check(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out {
			got := d.Remaining
			if !d.Allowed {
				got = -1
				if d.Reason != sluice.ReasonLimited || d.RetryAfter <= 0 {
					t.Errorf("%s round %d, check %d (%s): refused %+v, want ReasonLimited and a retry after", a, round, i, keys[i], d)
				}
			}
			if got != w[i] {
				t.Errorf("%s round %d, check %d (%s): remaining %d, want %d (%+v)", a, round, i, keys[i], got, w[i], d)
			}
			if d.ResetAfter <= 0 || d.ResetAfter > time.Hour {
				t.Errorf("%s round %d, check %d (%s): reset after %v, want within the hour", a, round, i, keys[i], d.ResetAfter)
			}
		}
	}
}
