package globalsync

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
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
}

func newNet(t testing.TB, s *natstest.Server) *testNet {
	name := s.Name("T")
	return &testNet{t: t, s: s, stream: "SYNC_" + name, subject: "sync" + name}
}

// start starts a Sync of region on the test's stream, closed when the
// test ends.
func (n *testNet) start(region string) *Sync {
	n.t.Helper()
	sy, err := Start(context.Background(), Config{
		Region:     region,
		URL:        n.s.URL(),
		Stream:     n.stream,
		Subject:    n.subject,
		FlushEvery: 10 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
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
func currentWindow(key string) Window {
	now := time.Now().UnixMilli()
	return Window{Key: key, Start: now - now%60_000, Length: time.Minute}
}

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
