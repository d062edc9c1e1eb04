package analytics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// clock is a settable clock for a Recorder's Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func minuteOf(m int) time.Time   { return day0.Add(time.Duration(m) * time.Minute) }

// runMinutes records, for minutes 0..minutes-1, perMin(m) checks of
// client c on /a in eu (blocked(m) of them refused), spread over the
// minute, flushing with the clock 30s into each minute, then closes the
// last minute. It returns the anomalies the store holds.
func runMinutes(t *testing.T, cfg DetectorConfig, minutes int, perMin func(m int) (n, blocked int)) ([]Anomaly, Stats) {
	t.Helper()
	clk := &clock{t: day0}
	mem := NewMemory(MemoryConfig{Retention: 48 * time.Hour})
	rec := NewRecorder(Config{Memory: mem, Now: clk.Now, Detector: cfg, QueueSize: 1 << 16})
	defer rec.Close()
	ctx := context.Background()
	for m := range minutes {
		n, blocked := perMin(m)
		for i := range n {
			at := minuteOf(m).Add(time.Duration(i) * time.Minute / time.Duration(n))
			rec.Record(Event{Time: at, Client: "c", Resource: "/a", Region: "eu", Allowed: i >= blocked, Cost: 1})
		}
		clk.Set(minuteOf(m).Add(30 * time.Second))
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	clk.Set(minuteOf(minutes).Add(5 * time.Second))
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := mem.Query(ctx, Filter{Start: day0, End: minuteOf(minutes + 1)})
	if err != nil {
		t.Fatal(err)
	}
	return res.Anomalies, rec.Stats()
}

func TestDetector(t *testing.T) {
	const minutes, spikeAt = 40, 30
	tests := []struct {
		name   string
		perMin func(m int) (n, blocked int)
		want   []Anomaly
	}{
		{"steady", func(int) (int, int) { return 100, 0 }, nil},
		{"steady with a steady share blocked", func(int) (int, int) { return 100, 30 }, nil},
		{"10x spike", func(m int) (int, int) {
			if m == spikeAt {
				return 1000, 0
			}
			return 100, 0
		}, []Anomaly{{Kind: AnomalyRequests, Client: "c", Resource: "/a", Region: "eu", Minute: minuteOf(spikeAt).Unix(), Observed: 1000, Baseline: 100}}},
		{"block rate jumps", func(m int) (int, int) {
			if m == spikeAt {
				return 100, 90
			}
			return 100, 2
		}, []Anomaly{{Kind: AnomalyBlockRate, Client: "c", Resource: "/a", Region: "eu", Minute: minuteOf(spikeAt).Unix(), Observed: 0.9, Baseline: 0.02}}},
		{"spike below the minimum volume", func(m int) (int, int) {
			if m == spikeAt {
				return 90, 0
			}
			return 5, 0
		}, nil},
		{"spike during the warm-up", func(m int) (int, int) {
			if m == 3 {
				return 1000, 0
			}
			return 100, 0
		}, nil},
		{"idle minutes lower the baseline", func(m int) (int, int) {
			switch {
			case m == spikeAt:
				return 300, 0
			case m > 10 && m < spikeAt:
				return 0, 0
			}
			return 100, 0
		}, []Anomaly{{Kind: AnomalyRequests, Client: "c", Resource: "/a", Region: "eu", Minute: minuteOf(spikeAt).Unix(), Observed: 300}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, st := runMinutes(t, DetectorConfig{}, minutes, tt.perMin)
			if len(got) != len(tt.want) || st.Anomalies != int64(len(tt.want)) {
				t.Fatalf("got %d anomalies (stats %d) %+v, want %+v", len(got), st.Anomalies, got, tt.want)
			}
			for i, w := range tt.want {
				g := got[i]
				if g.Kind != w.Kind || g.Client != w.Client || g.Resource != w.Resource || g.Region != w.Region ||
					g.Minute != w.Minute || g.Observed != w.Observed || (w.Baseline != 0 && !near(g.Baseline, w.Baseline)) {
					t.Errorf("got %+v, want %+v", g, w)
				}
			}
		})
	}
}

func near(a, b float64) bool { return a > b*0.999 && a < b*1.001 }

// TestDetectorBounded: beyond MaxKeys, keys are not tracked, and their
// rollups are counted.
func TestDetectorBounded(t *testing.T) {
	d := newDetector(DetectorConfig{MaxKeys: 2})
	var rs []Rollup
	for _, c := range []string{"a", "b", "c", "d"} {
		rs = append(rs, Rollup{Key: Key{Minute: day0.Unix(), Client: c}, Requests: 1})
	}
	d.add(rs)
	// a's key and its resource's, then b, c and d each miss their own and
	// the resource's.
	if len(d.keys) != 2 || d.untracked != 3 {
		t.Errorf("tracked %d, untracked %d; want 2 and 3", len(d.keys), d.untracked)
	}
	// An hour idle, the keys are forgotten and make room.
	d.closeUpTo(day0.Add(time.Minute).Unix() + closeGrace)
	d.closeUpTo(day0.Add(2 * time.Hour).Unix())
	if len(d.keys) != 0 {
		t.Errorf("tracked %d after two idle hours, want 0", len(d.keys))
	}
	if newDetector(DetectorConfig{MaxKeys: -1}) != nil {
		t.Error("MaxKeys < 0: want no detector")
	}
}

// listSink keeps what it is given.
type listSink struct {
	mu      sync.Mutex
	changes []Change
	anoms   []Anomaly
}

func (s *listSink) Write(context.Context, []Rollup, []Event) error { return nil }
func (s *listSink) WriteLists(_ context.Context, cs []Change, as []Anomaly) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes = append(s.changes, cs...)
	s.anoms = append(s.anoms, as...)
	return nil
}

// TestChanges: changes reach the Memory store, which lists those of the
// range newest first, and a ListSink.
func TestChanges(t *testing.T) {
	mem := NewMemory(MemoryConfig{Retention: 48 * time.Hour})
	sink := &listSink{}
	rec := NewRecorder(Config{Memory: mem, Sink: sink, Now: func() time.Time { return minuteOf(10) }})
	defer rec.Close()
	for m := range 3 {
		rec.RecordChange(Change{Time: minuteOf(m), Kind: "rate_limit_config_updated", Detail: "version v" + string(rune('1'+m))})
	}
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	res, err := mem.Query(context.Background(), Filter{Start: minuteOf(1), End: minuteOf(10)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 2 || res.Changes[0].Detail != "version v3" || res.Changes[1].Detail != "version v2" {
		t.Errorf("changes of minutes 1..9: %+v", res.Changes)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.changes) != 3 {
		t.Errorf("sink got %d changes, want 3", len(sink.changes))
	}
}

// failingListSink fails its first WriteLists.
type failingListSink struct {
	listSink
	failed bool
}

func (s *failingListSink) WriteLists(ctx context.Context, cs []Change, as []Anomaly) error {
	s.mu.Lock()
	if !s.failed {
		s.failed = true
		s.mu.Unlock()
		return errors.New("down")
	}
	s.mu.Unlock()
	return s.listSink.WriteLists(ctx, cs, as)
}

// TestListsRetried: changes a failed write did not keep are offered again
// with the next flush, once.
func TestListsRetried(t *testing.T) {
	sink := &failingListSink{}
	rec := NewRecorder(Config{Sink: sink, FlushInterval: time.Hour, Now: func() time.Time { return minuteOf(10) }})
	defer rec.Close()
	rec.RecordChange(Change{Time: minuteOf(1), Kind: "rate_limit_config_updated"})
	ctx := context.Background()
	for range 3 {
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if st := rec.Stats(); len(sink.changes) != 1 || st.SinkErrors != 1 || st.SinkFailing {
		t.Errorf("sink has %d changes, stats %+v; want 1 after one failure", len(sink.changes), st)
	}
}

// TestDetectorResource: a surge spread over many new clients, none of
// them tracked long enough to be judged, is one anomaly of the resource
// (every client together, an empty client).
func TestDetectorResource(t *testing.T) {
	d := newDetector(DetectorConfig{})
	var found []Anomaly
	for m := range 40 {
		rs := []Rollup{{Key: Key{Minute: minuteOf(m).Unix(), Client: "steady", Resource: "/a", Region: "eu"}, Requests: 100}}
		if m == 30 {
			for i := range 50 {
				rs = append(rs, Rollup{Key: Key{Minute: minuteOf(m).Unix(), Client: fmt.Sprint("bot-", i), Resource: "/a", Region: "eu"}, Requests: 20})
			}
		}
		d.add(rs)
		found = append(found, d.closeUpTo(minuteOf(m+1).Unix()+closeGrace)...)
	}
	want := Anomaly{Kind: AnomalyRequests, Resource: "/a", Region: "eu", Minute: minuteOf(30).Unix(), Observed: 1100, Baseline: 100}
	if len(found) != 1 || found[0].Client != "" || found[0].Minute != want.Minute || found[0].Observed != want.Observed || !near(found[0].Baseline, 100) {
		t.Errorf("got %+v, want %+v", found, want)
	}
}
