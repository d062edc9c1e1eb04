package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestEachReply checks the conversion of checkeach.lua's reply into
// check.lua's layout, and that a reply of the wrong shape is an error.
func TestEachReply(t *testing.T) {
	got, err := eachReply([]int64{1, 7*4 + 0, 50, 0*4 + 1, 60, 60, 0*4 + 2, 0, 0}, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{1, 0, 1, 0, 7, 50, 0, 0, 1, 0, 60, 60, 0, 2, 0, 0, 0}
	if !slices.Equal(got, want) {
		t.Errorf("eachReply = %v, want %v", got, want)
	}
	// A common call's admitted checks answer -1 - the debt after them: a
	// burst of 10 at 5 per window of 4 quanta (capacity 40), debts 4, 0
	// and 40, among a denial.
	p := &algorithm.Params{Limit: 5, Burst: 10, Window: 4}
	got, err = eachReply([]int64{0, -5, 0*4 + 1, 8, 8, -1, -41}, 4, p)
	if err != nil {
		t.Fatal(err)
	}
	want = []int64{0, 0, 1, 0, 9, 1, 0, 0, 1, 0, 8, 8, 1, 0, 10, 0, 0, 1, 0, 0, 8, 0}
	if !slices.Equal(got, want) {
		t.Errorf("eachReply, common call = %v, want %v", got, want)
	}
	if _, err := eachReply([]int64{0, -5}, 1, nil); !errors.Is(err, errEachReply) {
		t.Errorf("eachReply of a debt without a common call: %v, want errEachReply", err)
	}
	if _, err := eachValues(make([]byte, 12)); !errors.Is(err, errEachReply) {
		t.Errorf("eachValues of 12 bytes: %v, want errEachReply", err)
	}
	for _, bad := range []struct {
		vals []int64
		n    int
	}{
		{[]int64{0}, 1},              // no check
		{[]int64{0, 4}, 1},           // a check cut short
		{[]int64{0, 4 + 1, 5}, 1},    // a denial without its retry
		{[]int64{0, 4, 5, 9}, 1},     // a value too many
		{[]int64{0, 4, 5, 4 + 1}, 2}, // a second check cut short
	} {
		if _, err := eachReply(bad.vals, bad.n, nil); !errors.Is(err, errEachReply) {
			t.Errorf("eachReply(%v, %d): %v, want errEachReply", bad.vals, bad.n, err)
		}
	}
}

// TestEachStateLayouts checks that both scripts read a fixed window's
// state in the text and 25-byte layouts of earlier versions (a key written
// before an upgrade keeps its count), that they write it as a hash of
// the window's start and count, and that a call mixing instants and
// Redis' clock and one at Redis' clock alone decide alike.
func TestEachStateLayouts(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	ctx := context.Background()
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Minute})
	for _, via := range []string{"Check", "CheckAll"} {
		key := "rl:layout:" + via
		// 3 admitted at t0 (the start of a minute), in the text layout.
		if _, err := srv.Do("SET", key, "1:"+strconv.FormatInt(t0.UnixMicro(), 10)+":3:0", "PX", "120000"); err != nil {
			t.Fatal(err)
		}
		out := checkVia(t, s, via, []store.Request{{Key: key, Params: p, Cost: 1, Now: t0.Add(time.Second)}})
		if d := out[0]; !d.Allowed || d.Remaining != 1 {
			t.Errorf("%s on the text layout: %+v, want allowed with 1 remaining", via, d)
		}
		n, err := srv.Do("HLEN", key)
		if err != nil {
			t.Fatal(err)
		}
		field := strconv.FormatInt(t0.UnixMicro()/p.Quantum, 10)
		v, err := srv.Do("HGET", key, field)
		if err != nil || n != "1" || v != "4" {
			t.Errorf("%s wrote %s fields, %q in field %s (%v); want the hash {%[4]s: 4}", via, n, v, field, err)
		}
		out = checkVia(t, s, via, []store.Request{{Key: key, Params: p, Cost: 2, Now: t0.Add(2 * time.Second)}})
		if d := out[0]; d.Allowed || d.Remaining != 1 {
			t.Errorf("%s on the hash: %+v, want denied with 1 remaining", via, d)
		}
		// The 25-byte layout of the previous version: 3 admitted at t0.
		var st []byte
		st = append(st, 2)
		for _, x := range []int64{t0.UnixMicro() / p.Quantum, 3, 0} {
			st = binary.LittleEndian.AppendUint64(st, math.Float64bits(float64(x)))
		}
		if _, err := srv.Do("SET", key, string(st), "PX", "120000"); err != nil {
			t.Fatal(err)
		}
		out = checkVia(t, s, via, []store.Request{{Key: key, Params: p, Cost: 2, Now: t0.Add(2 * time.Second)}})
		if d := out[0]; !d.Allowed || d.Remaining != 0 {
			t.Errorf("%s on the 25-byte layout: %+v, want allowed with 0 remaining", via, d)
		}
		if s.CorruptResets() != 0 {
			t.Errorf("%s: %d corrupt resets, want 0", via, s.CorruptResets())
		}
	}
	// A text state of 25 bytes, the length of the binary layout.
	big := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 2000, Window: time.Minute})
	st := "1:" + strconv.FormatInt(t0.UnixMicro(), 10) + ":1234:0"
	if len(st) != 25 {
		t.Fatalf("%q is %d bytes, want 25", st, len(st))
	}
	for _, via := range []string{"Check", "CheckAll"} {
		key := "rl:layout:25:" + via
		if _, err := srv.Do("SET", key, st, "PX", "120000"); err != nil {
			t.Fatal(err)
		}
		out := checkVia(t, s, via, []store.Request{{Key: key, Params: big, Cost: 1, Now: t0.Add(time.Second)}})
		if d := out[0]; !d.Allowed || d.Remaining != 765 || s.CorruptResets() != 0 {
			t.Errorf("%s on a 25-byte text state: %+v, %d corrupt resets; want allowed with 765 remaining, none reset", via, d, s.CorruptResets())
		}
	}
	// One call at Redis' clock with one set and cost, another with two
	// costs and an instant: both decide each check on its own.
	q := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 10, Window: time.Hour})
	reqs := []store.Request{
		{Key: "rl:layout:u1", Params: q, Cost: 4}, {Key: "rl:layout:u2", Params: q, Cost: 4},
		{Key: "rl:layout:u1", Params: q, Cost: 4},
	}
	mixed := []store.Request{
		{Key: "rl:layout:m1", Params: q, Cost: 4}, {Key: "rl:layout:m2", Params: q, Cost: 3},
		{Key: "rl:layout:m1", Params: q, Cost: 7}, {Key: "rl:layout:m3", Params: q, Cost: 2, Now: t0},
	}
	out := make([]sluice.Decision, len(mixed))
	if err := s.Check(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || out[0].Remaining != 6 || !out[1].Allowed || !out[2].Allowed || out[2].Remaining != 2 {
		t.Errorf("at Redis' clock: %+v", out[:3])
	}
	if err := s.Check(ctx, mixed, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || out[1].Remaining != 7 || out[2].Allowed || out[2].Remaining != 6 || !out[3].Allowed || out[3].Remaining != 8 {
		t.Errorf("mixed: %+v", out)
	}
}

// TestCheckOfMoreLimitsThanOneCallNumbers checks a Check whose requests
// use more distinct limits than one checkeach.lua call can number (16
// bits): each is decided against its own limit.
func TestCheckOfMoreLimitsThanOneCallNumbers(t *testing.T) {
	if testing.Short() {
		t.Skip("a Check of 65,545 requests")
	}
	srv := redistest.Start(t)
	// Scripts of 65,535 checks take seconds under the race detector on a
	// busy machine: longer than the default wait for an answer.
	s := newStore(t, Config{Addrs: []string{srv.Addr}, WriteTimeout: 30 * time.Second})
	n := maxEachChecks + 10
	reqs := make([]store.Request, n)
	for i := range reqs {
		p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: int64(i + 2), Window: time.Minute})
		reqs[i] = store.Request{Key: "rl:many:" + strconv.Itoa(i), Params: p, Cost: 1}
	}
	out := make([]sluice.Decision, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Check(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	for i, d := range out {
		if !d.Allowed || d.Limit != int64(i+2) || d.Remaining != int64(i+1) {
			t.Fatalf("request %d: %+v, want allowed with limit %d, remaining %d", i, d, i+2, i+1)
		}
	}
}

// TestAllEachRoute checks which all-or-nothing batches checkeach.lua
// decides (distinct keys of the three-integer algorithms) and which go to
// check.lua, and that a denied batch of checkeach.lua writes nothing and
// reports the admitted request as it stands, as check.lua does.
func TestAllEachRoute(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	fw := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: time.Minute})
	gcra := compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 1, Window: time.Minute})
	log := compile(t, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 5, Window: time.Minute})
	many := make([]store.Request, 12)
	for i := range many {
		many[i] = store.Request{Key: "k" + strconv.Itoa(i), Params: fw, Cost: 1}
	}
	for _, tc := range []struct {
		name string
		reqs []store.Request
		each bool
	}{
		{"two keys", []store.Request{{Key: "a", Params: fw, Cost: 1}, {Key: "b", Params: gcra, Cost: 1}}, true},
		{"twelve keys", many, true},
		{"a key twice", []store.Request{{Key: "a", Params: fw, Cost: 1}, {Key: "a", Params: fw, Cost: 1}}, false},
		{"a key twice past eight", append(slices.Clone(many), many[10]), false},
		{"a log", []store.Request{{Key: "a", Params: fw, Cost: 1}, {Key: "b", Params: log, Cost: 1}}, false},
	} {
		if got := s.allEach(tc.reqs) != nil; got != tc.each {
			t.Errorf("%s: by checkeach.lua %v, want %v", tc.name, got, tc.each)
		}
	}

	ctx := context.Background()
	reqs := []store.Request{{Key: "rl:a", Params: fw, Cost: 2, Now: t0}, {Key: "rl:b", Params: gcra, Cost: 1, Now: t0}}
	out := make([]sluice.Decision, 2)
	for i, wantAllowed := range []bool{true, false} {
		if err := s.CheckAll(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed != wantAllowed || out[1].Allowed != wantAllowed {
			t.Fatalf("call %d: got %+v, want allowed %v", i, out, wantAllowed)
		}
	}
	// The second call: rl:b's GCRA refused it, and rl:a reports its 3
	// left, limited, without a retry.
	if d := out[0]; d.Reason != sluice.ReasonLimited || d.Remaining != 3 || d.RetryAfter != 0 {
		t.Errorf("admitted request of a denied batch: got %+v, want limited, 3 remaining, no retry", d)
	}
	if d := out[1]; d.Reason != sluice.ReasonLimited || d.RetryAfter <= 0 {
		t.Errorf("denied request: got %+v, want limited with a retry", d)
	}
	one := make([]sluice.Decision, 1)
	if err := s.Check(ctx, []store.Request{{Key: "rl:a", Params: fw, Now: t0}}, one); err != nil {
		t.Fatal(err)
	}
	if one[0].Remaining != 3 {
		t.Errorf("rl:a after a denied batch: %d remaining, want 3 (nothing consumed)", one[0].Remaining)
	}
}

// TestFixedWindowUpgrade checks that the common call of fixed-window
// checks at Redis' clock, which counts with HINCRBY, reads the 25-byte
// state an earlier version wrote for the current window: the count goes
// on, and the key becomes the hash.
func TestFixedWindowUpgrade(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	p := compile(t, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 5, Window: 1000 * time.Hour})
	// Redis runs on this machine's clock; a window of 1000 hours makes a
	// window's end between here and the check all but impossible.
	q := time.Now().UnixMicro() / p.Quantum
	start := q - q%p.Window
	var st []byte
	st = append(st, 2)
	for _, x := range []int64{start, 3, 0} {
		st = binary.LittleEndian.AppendUint64(st, math.Float64bits(float64(x)))
	}
	for _, k := range []string{"up:a", "up:b"} {
		if _, err := srv.Do("SET", k, string(st), "PX", "600000"); err != nil {
			t.Fatal(err)
		}
	}
	reqs := []store.Request{{Key: "up:a", Params: p, Cost: 1}, {Key: "up:b", Params: p, Cost: 1}, {Key: "up:a", Params: p, Cost: 1}}
	out := make([]sluice.Decision, len(reqs))
	if err := s.Check(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{1, 1, 0} {
		if d := out[i]; !d.Allowed || d.Remaining != want {
			t.Errorf("check %d: %+v, want allowed with %d remaining", i, d, want)
		}
	}
	if v, err := srv.Do("HGET", "up:a", strconv.FormatInt(start, 10)); err != nil || v != "5" {
		t.Errorf("up:a's window holds %q (%v), want 5", v, err)
	}
	if v, err := srv.Do("PTTL", "up:a"); err != nil || v == "-1" || strings.HasPrefix(v, "-") {
		t.Errorf("up:a's time to live: %q (%v), want one", v, err)
	}
	if s.CorruptResets() != 0 {
		t.Errorf("%d corrupt resets, want 0", s.CorruptResets())
	}
}

// TestDistinct checks the test that lets checkeach.lua read a call's keys
// with one MGET: a key that appears twice must be read after its first
// check's write, on both sides of the size where a map takes over.
func TestDistinct(t *testing.T) {
	many := func(n int, dup bool) []string {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "k" + strconv.Itoa(i)
		}
		if dup {
			keys[n-1] = keys[0]
		}
		return keys
	}
	for _, tc := range []struct {
		keys []string
		want bool
	}{
		{nil, true},
		{[]string{"a"}, true},
		{[]string{"a", "b"}, true},
		{[]string{"a", "a"}, false},
		{many(16, false), true},
		{many(16, true), false},
		{many(17, false), true},
		{many(17, true), false},
	} {
		if got := distinct(tc.keys); got != tc.want {
			t.Errorf("distinct(%d keys %v...) = %v, want %v", len(tc.keys), tc.keys[:min(len(tc.keys), 2)], got, tc.want)
		}
	}
}
