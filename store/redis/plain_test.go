package redis

import (
	"context"
	"fmt"
	"maps"
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

// waitClock waits until s has an estimate of Redis' clock, so that its
// fixed-window checks go plain.
func waitClock(t testing.TB, s *Store) {
	t.Helper()
	s.startClock() // as a store's first plain-eligible check does
	for range 500 {
		if _, _, ok := s.clock.at(time.Now()); ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no reading of Redis' clock after 5s")
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
		got := len(s.planPlain(reqs, now)) == 1
		if got != c.want {
			t.Errorf("server %d ± %d µs: plain %v, want %v", c.server-start, c.err, got, c.want)
		}
	}
	s.clock.last.Store(&clockReading{local: now.Add(-clockFresh - time.Millisecond), server: start + 500_000, err: 100})
	if plain := s.planPlain(reqs, now); len(plain) != 0 {
		t.Errorf("stale estimate: %d plain checks, want 0", len(plain))
	}
	s.clock.last.Store(&clockReading{local: now, server: start + 500_000, err: 100})
	mixed := []store.Request{{Key: "a", Params: p, Cost: 1}, {Key: "b", Params: p, Cost: 1}, {Key: "a", Params: p, Cost: 2}}
	if plain := s.planPlain(mixed, now); len(plain) != 1 || plain[0].i != 1 {
		t.Errorf("mixed call: plain %+v, want request 1 alone", plain)
	}
}

// TestPlainFixedWindowExact races 4 stores (4 instances) with 16
// goroutines each on one key, every check a plain HINCRBY of cost 1: the
// key admits exactly its limit although refused increments are visible to
// the others until given back, the count left in Redis is the limit (every
// refusal given back) and the key expires at its window's end.
func TestPlainFixedWindowExact(t *testing.T) {
	srv := redistest.Start(t)
	const stores, goroutines, each, limit = 4, 16, 20, 300
	ss := make([]*Store, stores)
	for i := range ss {
		ss[i] = newStore(t, Config{Addrs: []string{srv.Addr}})
		waitClock(t, ss[i])
	}
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: limit, Window: 1000 * time.Hour})
	const key = "rl:plain:exact"
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
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
	stats := commandStats(t, srv)
	// Every check a plain HINCRBY; a refusal given back by a script each
	// (an EVALSHA, and an EVAL after those Redis answered NOSCRIPT, before
	// it had the script); the window's first count given its expiry by
	// two PEXPIREAT (NX, GT) and the previous window's field dropped.
	if want := int(refused.Load()); stats["evalsha"] != want || stats["eval"] > stores*goroutines || stats["pexpireat"] != 2 || stats["hdel"] != 1 {
		t.Errorf("commands %v, want %d EVALSHA, 2 PEXPIREAT and 1 HDEL", stats, want)
	}
	h, err := srv.Do("HGETALL", key)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d\n%d", time.Now().UnixMicro()/(1000*3600e6)*1000*3600e6, limit); h != want {
		t.Errorf("HGETALL = %s, want %s", h, want)
	}
	if ttl, err := srv.Do("PTTL", key); err != nil || ttl == "-1" || ttl == "-2" {
		t.Errorf("PTTL = %s, %v: want the window's expiry", ttl, err)
	}
}

// TestPlainResetDuringRefusals resets a key at its limit again and again
// while goroutines are refused on it: no count ever goes negative, and
// once every refusal is given back the key holds at most its limit and a
// time to live (or is absent).
func TestPlainResetDuringRefusals(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
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
			v, err := srv.Do("HVALS", key)
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
	v, _ := srv.Do("HVALS", key)
	for _, f := range strings.Fields(v) {
		if n, err := strconv.Atoi(f); err != nil || n < 0 || n > limit {
			t.Errorf("count left %q, want 0 to %d", f, limit)
		}
	}
	if ttl, err := srv.Do("PTTL", key); err != nil || ttl == "-1" {
		t.Errorf("PTTL = %s, %v: want an expiry or no key", ttl, err)
	}
}

// TestPlainLaterWindow checks that a check at Redis' clock of a key
// holding a later window (written by a request ahead of Redis' clock,
// which the scripts write as a string, not a hash) is decided by the
// script, against that window, as on every store.
func TestPlainLaterWindow(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
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
		if typ, err := srv.Do("TYPE", key); err != nil || typ != "string" {
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
func TestPlainCommands(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
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
		stats := measure(t, srv, func() {
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
func TestPlainMatchesScript(t *testing.T) {
	srv := redistest.Start(t)
	plain := newStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "plain:"})
	scripts := newStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "scripts:", ScriptsOnly: true})
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
		a, _ := srv.Do("HVALS", "plain:"+key)
		b, _ := srv.Do("HVALS", "scripts:"+key)
		if a != b {
			t.Errorf("counting refused %v: count %q, want %q as the script's", counting, a, b)
		}
	}
}
