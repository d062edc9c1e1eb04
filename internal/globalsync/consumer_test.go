package globalsync

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/internal/guard/guardtest"
)

// A region cut off keeps its consumer on the server, and reads on with it
// when the connection is back; a consumer lost meanwhile is made again.
func TestConsumerOutlivesAPartition(t *testing.T) {
	n := newNet(t, srv)
	proxy := guardtest.StartProxy(t, srv.Addr())
	us := n.start("us", "eu")
	eu := n.startVia("nats://"+proxy.Addr(), "eu", "us")
	eventually(t, "connected", func() bool { return us.Status().Connected && eu.Status().Connected })
	w := currentWindow("global:partition")
	us.Observe(w, 3)
	eventually(t, "eu sees us", wantSeen(t, eu, w, 3))

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// euConsumers returns the names of the consumers reading eu's
	// subject first: eu's own.
	euConsumers := func() []string {
		t.Helper()
		var names []string
		st, err := js.Stream(context.Background(), n.stream)
		if err != nil {
			t.Fatal(err)
		}
		l := st.ListConsumers(context.Background())
		for info := range l.Info() {
			if f := info.Config.FilterSubjects; len(f) > 0 && strings.HasSuffix(f[0], ".eu") {
				names = append(names, info.Name)
			}
		}
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
		return names
	}
	before := euConsumers()
	if len(before) != 1 {
		t.Fatalf("eu's consumers: %v, want one", before)
	}

	proxy.Disable(t)
	eventually(t, "eu cut off", func() bool { return !eu.Status().Connected })
	us.Observe(w, 8)
	eu.Observe(w, 5)
	proxy.Enable(t)
	eventually(t, "eu sees us after the partition", wantSeen(t, eu, w, 8))
	eventually(t, "us sees eu after the partition", wantSeen(t, us, w, 5))
	if after := euConsumers(); len(after) != 1 || after[0] != before[0] {
		t.Errorf("eu's consumers after the partition: %v, want %v still", after, before)
	}

	// Cut off again, and the consumer deleted meanwhile (as the server
	// does after InactiveThreshold, or when it restarts).
	proxy.Disable(t)
	eventually(t, "eu cut off", func() bool { return !eu.Status().Connected })
	if err := js.DeleteConsumer(context.Background(), n.stream, before[0]); err != nil {
		t.Fatal(err)
	}
	us.Observe(w, 12)
	proxy.Enable(t)
	eventually(t, "eu sees us with a new consumer", wantSeen(t, eu, w, 12))
	if after := euConsumers(); len(after) != 1 || after[0] == before[0] {
		t.Errorf("eu's consumers after its consumer was deleted: %v, want one other than %s", after, before[0])
	}
}

// A message read long after it was sent (catching up, or read again by a
// new consumer) shows that its region was reachable then, not now: a
// region heard only so stays quiet, and counts at its share.
func TestOldMessagesLeaveARegionQuiet(t *testing.T) {
	n := newNet(t, srv)
	eu := n.start("eu", "us")
	w := currentWindow("global:old")
	now := time.Now()
	for i, sent := range []time.Time{now.Add(-time.Minute), now.Add(-100 * time.Millisecond)} {
		data, err := AppendEncode(nil, &Message{Origin: "us", SentAt: sent.UnixMilli(), Seq: uint64(i + 1), Entries: []Entry{{Window: w, Count: 10}}})
		if err != nil {
			t.Fatal(err)
		}
		eu.merge(n.subject+".us", data, now)
		seen, reserve := eu.OthersWithin(w, 1000)
		// Quiet, us counts at its share: half of the limit.
		if quiet := seen+reserve >= 500; quiet != (i == 0) {
			t.Errorf("us sent %s before it was read: seen %d, reserve %d; want quiet %t", now.Sub(sent), seen, reserve, i == 0)
		}
	}
}
