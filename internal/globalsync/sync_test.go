package globalsync

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/internal/globalsync/natstest"
)

// srv is the NATS server the tests of this package share; each test has
// its own stream and subjects.
var srv *natstest.Server

func TestMain(m *testing.M) {
	s, err := natstest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv = s
	code := m.Run()
	s.Close()
	os.Exit(code)
}

// converge is how long counts may take to reach another region in these
// tests: far above the tens of milliseconds they take, so that a busy
// machine under the race detector does not fail them.
const converge = 15 * time.Second

// testNet is one test's stream and subjects on a server.
type testNet struct {
	t       testing.TB
	s       *natstest.Server
	stream  string
	subject string
	flush   time.Duration // the Syncs' FlushEvery
}

func newNet(t testing.TB, s *natstest.Server) *testNet {
	name := s.Name("T")
	return &testNet{t: t, s: s, stream: "SYNC_" + name, subject: "sync" + name, flush: 10 * time.Millisecond}
}

// start starts a Sync of region on the test's stream, closed when the
// test ends. It reads peers only, when any are given.
func (n *testNet) start(region string, peers ...string) *Sync {
	n.t.Helper()
	return n.startVia(n.s.URL(), region, peers...)
}

// startVia is start through the NATS URL url (a proxy, say).
func (n *testNet) startVia(url, region string, peers ...string) *Sync {
	n.t.Helper()
	sy, err := Start(context.Background(), Config{
		Region:     region,
		Peers:      peers,
		URL:        url,
		Stream:     n.stream,
		Subject:    n.subject,
		FlushEvery: n.flush,
		Logger:     testLogger(),
	})
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { sy.Close() })
	return sy
}

// publish publishes data on region's subject as another client would,
// once the stream exists.
func (n *testNet) publish(region string, data []byte) {
	n.t.Helper()
	nc, err := nats.Connect(n.s.URL())
	if err != nil {
		n.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	for {
		_, err := js.Publish(ctx, n.subject+"."+region, data)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			n.t.Fatalf("publish on %s: %v", region, err)
		}
		time.Sleep(20 * time.Millisecond) // the stream is not made yet
	}
}

// currentWindow returns the minute window of key that holds now.
func currentWindow(key string) Window { return WindowAt(key, time.Minute, time.Now()) }

// eventually waits until cond holds, failing the test after converge.
func eventually(t testing.TB, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > converge {
			t.Fatalf("%s: not after %v", what, converge)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

func wantSeen(t testing.TB, sy *Sync, w Window, want int64) func() bool {
	return func() bool {
		seen, _ := sy.Others(w)
		if seen > want {
			t.Errorf("%s sees %d for %s, more than the %d counted", sy.cfg.Region, seen, w.Key, want)
		}
		return seen == want
	}
}

func TestCountsReachTheOtherRegions(t *testing.T) {
	n := newNet(t, srv)
	us, eu, ap := n.start("us"), n.start("eu"), n.start("ap")
	eventually(t, "all connected", func() bool {
		return us.Status().Connected && eu.Status().Connected && ap.Status().Connected
	})
	w := currentWindow("global:orders")
	for c := int64(1); c <= 10; c++ {
		us.Observe(w, c)
	}
	eu.Observe(w, 5)
	d := eventually(t, "ap sees us and eu", wantSeen(t, ap, w, 15))
	eventually(t, "us sees eu", wantSeen(t, us, w, 5))
	eventually(t, "eu sees us", wantSeen(t, eu, w, 10))
	t.Logf("counts reached the third region in %v", d)

	// A count going backwards (an older read of the same Redis counter)
	// changes nothing.
	us.Observe(w, 7)
	eu.Observe(w, 6)
	eventually(t, "ap sees eu's 6", wantSeen(t, ap, w, 16))
	if seen, _ := ap.Others(w); seen != 16 {
		t.Errorf("ap sees %d, want 16", seen)
	}

	// Each Sync ignores its own region's messages, which it reads too.
	eventually(t, "own messages counted", func() bool { return us.Status().Own > 0 })
	st := ap.Status()
	if len(st.Peers) != 2 || st.Peers[0].Region != "eu" || st.Peers[1].Region != "us" {
		t.Fatalf("ap's peers %+v, want eu and us", st.Peers)
	}
	for _, p := range st.Peers {
		if p.Messages == 0 || p.LastSync.IsZero() || p.SyncLagMs < 0 {
			t.Errorf("peer %+v: want messages, a last sync and a lag", p)
		}
	}
	eventually(t, "nothing pending", func() bool { return us.Status().PendingEvents == 0 })
	t.Logf("ap: %+v", st)
}

// Counts observed together travel together: thousands of windows in a
// few messages.
func TestBatching(t *testing.T) {
	n := newNet(t, srv)
	us, eu := n.start("us"), n.start("eu")
	eventually(t, "connected", func() bool { return us.Status().Connected && eu.Status().Connected })
	ws := make([]Window, 5000)
	for i := range ws {
		ws[i] = currentWindow(fmt.Sprintf("tenant:%d:global", i))
	}
	before := us.Status()
	for round := range 3 {
		for i, w := range ws {
			us.Observe(w, int64(round*10+i%7+1))
		}
	}
	for i, w := range ws {
		eventually(t, "eu sees "+w.Key, wantSeen(t, eu, w, int64(20+i%7+1)))
	}
	st := us.Status()
	msgs, entries := st.Published-before.Published, st.SentEntries-before.SentEntries
	t.Logf("%d counts in %d messages", entries, msgs)
	if msgs == 0 || entries/msgs < 100 {
		t.Errorf("%d counts in %d messages, want at least 100 a message", entries, msgs)
	}
}

// The instances of one region publish under its name: the other regions
// take the largest count, not the sum.
func TestInstancesOfOneRegion(t *testing.T) {
	n := newNet(t, srv)
	us1, us2, eu := n.start("us"), n.start("us"), n.start("eu")
	eventually(t, "connected", func() bool {
		return us1.Status().Connected && us2.Status().Connected && eu.Status().Connected
	})
	w := currentWindow("global:instances")
	// Both read the same Redis counter: us2's read came after us1's.
	us1.Observe(w, 40)
	us2.Observe(w, 41)
	eventually(t, "eu sees the larger count", wantSeen(t, eu, w, 41))
	us1.Observe(w, 42)
	eventually(t, "eu sees us1's newer count", wantSeen(t, eu, w, 42))
	eu.Observe(w, 3)
	eventually(t, "us1 sees eu", wantSeen(t, us1, w, 3))
	eventually(t, "us2 sees eu", wantSeen(t, us2, w, 3))
	if st := us2.Status(); st.Own == 0 || len(st.Peers) != 1 || st.Peers[0].Region != "eu" {
		t.Errorf("us2: own %d, peers %+v; want its region's messages ignored, eu as its peer", st.Own, st.Peers)
	}
}

// A Sync told its peers reads their subjects, and its own region's for
// Counts, only: not those of regions it was not told of.
func TestPeers(t *testing.T) {
	n := newNet(t, srv)
	us, eu, ap := n.start("us", "eu"), n.start("eu"), n.start("ap")
	eventually(t, "connected", func() bool {
		return us.Status().Connected && eu.Status().Connected && ap.Status().Connected
	})
	w := currentWindow("global:peers")
	ap.Observe(w, 100)
	eventually(t, "eu sees ap", wantSeen(t, eu, w, 100))
	us.Observe(w, 2)
	eu.Observe(w, 3)
	eventually(t, "us sees eu", wantSeen(t, us, w, 3))
	eventually(t, "eu sees us and ap", wantSeen(t, eu, w, 102))
	if st := us.Status(); len(st.Peers) != 1 || st.Peers[0].Region != "eu" {
		t.Errorf("us's peers %+v; want eu only", st.Peers)
	}
	if seen, _ := us.Others(w); seen != 3 {
		t.Errorf("us sees %d of the others, want eu's 3 (not ap's, nor its own)", seen)
	}
	if _, err := Start(context.Background(), Config{Region: "us", Peers: []string{"eu.*"}}); err == nil {
		t.Errorf("Start accepted a peer with a wildcard")
	}
}

// Messages sent by hand: duplicates, reordering and counts going
// backwards leave the sums as the largest count per region.
func TestDuplicatesAndReorderingChangeNothing(t *testing.T) {
	n := newNet(t, srv)
	eu := n.start("eu")
	eventually(t, "connected", func() bool { return eu.Status().Connected })
	w := currentWindow("global:search")
	other := Window{Key: "global:other", Start: w.Start, Length: w.Length}
	msg := func(origin string, seq uint64, counts ...int64) []byte {
		m := Message{Origin: origin, Instance: "hand", SentAt: time.Now().UnixMilli(), Seq: seq}
		for i, c := range counts {
			ww := w
			if i == 1 {
				ww = other
			}
			m.Entries = append(m.Entries, Entry{Window: ww, Count: c})
		}
		b, err := AppendEncode(nil, &m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	n.publish("us", msg("us", 3, 30, 3))
	n.publish("us", msg("us", 1, 10, 1)) // reordered: older, smaller
	n.publish("us", msg("us", 3, 30, 3)) // duplicate
	n.publish("us", msg("us", 2, 20, 2)) // older still
	n.publish("ap", msg("ap", 1, 4, 40))
	n.publish("ap", msg("ap", 1, 4, 40))
	eventually(t, "eu merged the six messages", func() bool { return eu.Status().Received == 6 })
	for _, tc := range []struct {
		w    Window
		want int64
	}{{w, 34}, {other, 43}} {
		if seen, _ := eu.Others(tc.w); seen != tc.want {
			t.Errorf("%s: seen %d, want %d", tc.w.Key, seen, tc.want)
		}
	}
	if st := eu.Status(); st.Merged != 4 || st.Stale != 8 {
		t.Errorf("merged %d entries and ignored %d, want 4 and 8", st.Merged, st.Stale)
	}
}

// What is not a sync message of ours is counted and dropped, and the
// consumer goes on.
func TestGarbageIsCountedAndDropped(t *testing.T) {
	n := newNet(t, srv)
	eu := n.start("eu")
	eventually(t, "connected", func() bool { return eu.Status().Connected })
	w := currentWindow("global:garbage")
	good, err := AppendEncode(nil, &Message{Origin: "us", SentAt: time.Now().UnixMilli(), Seq: 1, Entries: []Entry{{Window: w, Count: 12}}})
	if err != nil {
		t.Fatal(err)
	}
	spoofed, err := AppendEncode(nil, &Message{Origin: "ap", SentAt: time.Now().UnixMilli(), Seq: 1, Entries: []Entry{{Window: w, Count: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	own, err := AppendEncode(nil, &Message{Origin: "eu", SentAt: time.Now().UnixMilli(), Seq: 1, Entries: []Entry{{Window: w, Count: 500}}})
	if err != nil {
		t.Fatal(err)
	}
	n.publish("us", []byte(`{"region":"us","count":99}`))                                     // foreign
	n.publish("us", good[:len(good)-2])                                                       // truncated
	n.publish("us", append(bytes.Clone(good), 0))                                             // trailing byte: malformed
	n.publish("us", bytes.Repeat([]byte{magic0, magic1, wireVersion, 0}, MaxMessageSize/4+1)) // oversized
	n.publish("us", spoofed)                                                                  // ap's counts on us's subject
	n.publish("eu", own)                                                                      // our own region
	n.publish("us", good)
	eventually(t, "the good message merged", wantSeen(t, eu, w, 12))
	st := eu.Status()
	if st.Foreign != 2 || st.Malformed != 3 || st.Own < 1 || st.Received != 1 {
		t.Errorf("foreign %d, malformed %d, own %d, received %d; want 2, 3, at least 1, 1", st.Foreign, st.Malformed, st.Own, st.Received)
	}
}

// NATS stops (or dies) while the regions count: the counts wait in the outbox, a
// Sync started meanwhile starts without it, and after NATS comes back
// every region's sums are exact.
func TestNATSRestart(t *testing.T) {
	t.Run("stop", func(t *testing.T) { testNATSRestart(t, (*natstest.Server).Stop) })
	t.Run("kill", func(t *testing.T) { testNATSRestart(t, (*natstest.Server).Kill) })
}

func testNATSRestart(t *testing.T, stop func(*natstest.Server)) {
	s, err := natstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := newNet(t, s)
	us, eu := n.start("us"), n.start("eu")
	eventually(t, "connected", func() bool { return us.Status().Connected && eu.Status().Connected })
	w := currentWindow("global:restart")
	us.Observe(w, 10)
	eventually(t, "eu sees us before the stop", wantSeen(t, eu, w, 10))

	stop(s)
	eventually(t, "us notices the stop", func() bool { return !us.Status().Connected })
	keys := make([]Window, 500)
	for i := range keys {
		keys[i] = currentWindow(fmt.Sprintf("global:k%d", i))
		us.Observe(keys[i], int64(i+1))
		eu.Observe(keys[i], 1000)
	}
	us.Observe(w, 50)
	started := time.Now()
	ap := n.start("ap") // NATS is down: Start neither fails nor waits
	if d := time.Since(started); d > time.Second {
		t.Errorf("Start took %v with NATS down", d)
	}
	ap.Observe(w, 7)
	time.Sleep(100 * time.Millisecond) // several flush periods without NATS
	if st := us.Status(); st.PendingEvents != len(keys)+1 {
		t.Errorf("us has %d windows pending while NATS is down, want %d", st.PendingEvents, len(keys)+1)
	}

	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "eu sees us and ap after the restart", wantSeen(t, eu, w, 57))
	eventually(t, "ap sees us after the restart", wantSeen(t, ap, w, 50))
	eventually(t, "us sees ap after the restart", wantSeen(t, us, w, 7))
	for i, k := range keys {
		eventually(t, "ap sees "+k.Key, wantSeen(t, ap, k, int64(i+1)+1000))
	}
	for _, sy := range []*Sync{us, eu, ap} {
		eventually(t, sy.cfg.Region+" has nothing pending", func() bool { return sy.Status().PendingEvents == 0 })
	}
}

// Many goroutines of two regions count and check at once, as the check
// path does: the sums each region ends up with are exact.
func TestConcurrentUse(t *testing.T) {
	n := newNet(t, srv)
	regions := []*Sync{n.start("us"), n.start("eu")}
	eventually(t, "connected", func() bool { return regions[0].Status().Connected && regions[1].Status().Connected })
	ws := make([]Window, 64)
	for i := range ws {
		ws[i] = currentWindow(fmt.Sprintf("global:c%d", i))
	}
	// counters[r][i] stands for region r's Redis counter of window i.
	counters := make([][]atomic.Int64, len(regions))
	var wg sync.WaitGroup
	for r, sy := range regions {
		counters[r] = make([]atomic.Int64, len(ws))
		for g := range 4 {
			wg.Go(func() {
				for k := range 2000 {
					i := (g*7 + k) % len(ws)
					sy.Others(ws[i])
					sy.Observe(ws[i], counters[r][i].Add(1))
				}
			})
		}
	}
	wg.Wait()
	for r, sy := range regions {
		other := 1 - r
		for i, w := range ws {
			eventually(t, sy.cfg.Region+" sees "+w.Key, wantSeen(t, sy, w, counters[other][i].Load()))
		}
	}
}

// BenchmarkPropagation measures, per op, the time from a count observed
// in one region to its arrival in another's Others, with the default
// flush period of 20ms: the wait for the next flush, then the transport,
// whose p95 (send to arrival) it reports as p95-lag-ms.
func BenchmarkPropagation(b *testing.B) {
	n := newNet(b, srv)
	n.flush = 0
	us, eu := n.start("us"), n.start("eu")
	eventually(b, "connected", func() bool { return us.Status().Connected && eu.Status().Connected })
	w := currentWindow("global:propagation")
	var c int64
	for b.Loop() {
		c++
		us.Observe(w, c)
		for {
			if seen, _ := eu.Others(w); seen >= c {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	if st := eu.Status(); len(st.Peers) == 1 {
		b.ReportMetric(float64(st.Peers[0].SyncLagMs), "p95-lag-ms")
	}
}

// An operator deletes the stream: the regions make it again and go on.
func TestStreamDeleted(t *testing.T) {
	n := newNet(t, srv)
	us, eu := n.start("us"), n.start("eu")
	eventually(t, "connected", func() bool { return us.Status().Connected && eu.Status().Connected })
	w := currentWindow("global:deleted")
	us.Observe(w, 5)
	eventually(t, "eu sees us", wantSeen(t, eu, w, 5))

	nc, err := nats.Connect(n.s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(context.Background(), n.stream); err != nil {
		t.Fatal(err)
	}
	us.Observe(w, 9)
	eventually(t, "eu sees us after the stream is made again", wantSeen(t, eu, w, 9))
	eu.Observe(w, 4)
	eventually(t, "us sees eu", wantSeen(t, us, w, 4))
}

func BenchmarkObserve(b *testing.B) {
	sy := newNet(b, srv).start("us")
	ws := benchWindows()
	for i, w := range ws {
		sy.Observe(w, int64(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	var c int64
	for i := 0; b.Loop(); i++ {
		c++
		sy.Observe(ws[i&(len(ws)-1)], c)
	}
}

func BenchmarkObserveParallel(b *testing.B) {
	sy := newNet(b, srv).start("us")
	ws := benchWindows()
	b.ReportAllocs()
	b.ResetTimer()
	var g atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		var c int64
		for i := int(g.Add(1)) * 7919; pb.Next(); i++ {
			c++
			sy.Observe(ws[i&(len(ws)-1)], c)
		}
	})
}

// othersBench returns a Sync holding three other regions' counts for
// every window of benchWindows.
func othersBench(b *testing.B) (*Sync, []Window) {
	sy := newNet(b, srv).start("us")
	ws := benchWindows()
	now := time.Now().UnixMilli()
	for i, w := range ws {
		for _, o := range []string{"eu", "ap", "sa"} {
			sy.state.Merge(o, w, int64(i+1), now-100, now)
		}
	}
	return sy, ws
}

func BenchmarkOthers(b *testing.B) {
	sy, ws := othersBench(b)
	b.ReportAllocs()
	b.ResetTimer()
	var sum int64
	for i := 0; b.Loop(); i++ {
		seen, r := sy.Others(ws[i&(len(ws)-1)])
		sum += seen + r
	}
	if sum == 0 {
		b.Fatal("no counts seen")
	}
}

func BenchmarkOthersParallel(b *testing.B) {
	sy, ws := othersBench(b)
	b.ReportAllocs()
	b.ResetTimer()
	var g atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine checks other keys than its neighbours, as
		// checks of different clients do.
		for i := int(g.Add(1)) * 7919; pb.Next(); i++ {
			sy.Others(ws[i&(len(ws)-1)])
		}
	})
}

// benchWindows returns 1,024 windows of current minute.
func benchWindows() []Window {
	ws := make([]Window, 1024)
	for i := range ws {
		ws[i] = currentWindow(fmt.Sprintf("tenant:%d:global", i))
	}
	return ws
}

func TestStartChecksTheConfig(t *testing.T) {
	for _, region := range []string{"", "us.east", "us*", "us east", strings.Repeat("r", MaxNameLen+1)} {
		if sy, err := Start(context.Background(), Config{Region: region}); err == nil {
			sy.Close()
			t.Errorf("Start accepted region %q", region)
		}
	}
	for name, cfg := range map[string]Config{
		"long instance name": {Region: "us", Instance: strings.Repeat("i", MaxNameLen+1)},
		"stream with a dot":  {Region: "us", Stream: "SYNC.1"},
		"subject wildcard":   {Region: "us", Subject: "sluice.*"},
		"subject empty part": {Region: "us", Subject: "sluice..sync"},
		"peer with a space":  {Region: "us", Peers: []string{"eu west"}},
	} {
		if sy, err := Start(context.Background(), cfg); err == nil {
			sy.Close()
			t.Errorf("Start accepted a %s", name)
		}
	}
}

// With no NATS to reach, Start neither fails nor waits, and the Sync
// answers from what it has: nothing.
func TestStartWithoutNATS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0") // a port nothing listens on once closed
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + l.Addr().String()
	l.Close()
	start := time.Now()
	sy, err := Start(context.Background(), Config{Region: "us", URL: url, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("Start without NATS: %v", err)
	}
	w := currentWindow("global:alone")
	sy.Observe(w, 3)
	if seen, r := sy.Others(w); seen != 0 || r != 0 {
		t.Errorf("Others = %d, %d alone; want 0, 0", seen, r)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Start and a check took %v without NATS", d)
	}
	time.Sleep(50 * time.Millisecond)
	if st := sy.Status(); st.Connected || st.PendingEvents != 1 {
		t.Errorf("status %+v; want not connected, one window pending", st)
	}
	if err := sy.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// showLog shows the Syncs' logs: go test -run X -args -log
var showLog = flag.Bool("log", false, "show the Syncs' logs")

func testLogger() *slog.Logger {
	if *showLog {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
