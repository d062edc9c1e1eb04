package analytics

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// day0 is a fixed UTC midnight the tests count from.
var day0 = time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)

// workload records a known set of events: for each of 3 days, at minutes
// 0, 1 and 61 of hours 0 and 5, client c1 is allowed twice in region eu
// and client c2 blocked once in region us. It returns the number of
// events per (day).
func workload(rec interface{ Record(Event) }) {
	for d := range 3 {
		for _, h := range []int{0, 5} {
			for _, m := range []int{0, 1, 61} {
				at := day0.Add(time.Duration(d)*24*time.Hour + time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + 7*time.Second)
				for range 2 {
					rec.Record(Event{Time: at, Client: "c1", Resource: "/a", Region: "eu", Allowed: true, Cost: 1, Latency: 100 * time.Microsecond})
				}
				rec.Record(Event{Time: at, Client: "c2", Resource: "/b", Region: "us", Allowed: false, Cost: 3, Latency: 1000 * time.Microsecond, Reason: "over_limit"})
			}
		}
	}
}

func TestQueryGranularities(t *testing.T) {
	mem := NewMemory(MemoryConfig{Retention: 7 * 24 * time.Hour})
	rec := NewRecorder(Config{Memory: mem, Now: func() time.Time { return day0.Add(3 * 24 * time.Hour) }})
	defer rec.Close()
	workload(rec)
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	end := day0.Add(3 * 24 * time.Hour)
	// 3 days x 2 hours x 3 minutes x 3 events.
	const total, blocked = 54, 18
	tests := []struct {
		g      Granularity
		points int
		first  Point
	}{
		{Minute, 18, Point{Start: day0, Total: 3, Allowed: 2, Blocked: 1}},
		// Minute 61 falls in hour 1 (and hour 6).
		{Hour, 12, Point{Start: day0, Total: 6, Allowed: 4, Blocked: 2}},
		{Day, 3, Point{Start: day0, Total: 18, Allowed: 12, Blocked: 6}},
	}
	for _, tt := range tests {
		res, err := mem.Query(context.Background(), Filter{Start: day0, End: end, Granularity: tt.g})
		if err != nil {
			t.Fatal(err)
		}
		s := res.Summary
		if s.Total != total || s.Blocked != blocked || s.Allowed != total-blocked {
			t.Errorf("granularity %d: summary = %+v, want total %d blocked %d", tt.g, s, total, blocked)
		}
		if got, want := s.Cost, int64(36*1+18*3); got != want {
			t.Errorf("cost = %d, want %d", got, want)
		}
		if got, want := s.AvgLatencyUS, (36*100.0+18*1000)/54; got != want {
			t.Errorf("avg latency = %v, want %v", got, want)
		}
		if s.P99LatencyUS < 1000 || s.P99LatencyUS > 1000*1.19 {
			t.Errorf("p99 = %vµs, want within a bucket above 1000µs", s.P99LatencyUS)
		}
		if len(res.TimeSeries) != tt.points {
			t.Fatalf("granularity %d: %d points, want %d", tt.g, len(res.TimeSeries), tt.points)
		}
		if got := res.TimeSeries[0]; got != tt.first {
			t.Errorf("granularity %d: first point = %+v, want %+v", tt.g, got, tt.first)
		}
		var sum int64
		for _, p := range res.TimeSeries {
			sum += p.Total
		}
		if sum != total {
			t.Errorf("granularity %d: series sums to %d, want %d", tt.g, sum, total)
		}
		if len(res.ByRegion) != 2 || res.ByRegion[0].Region != "eu" || res.ByRegion[0].Total != 36 || res.ByRegion[1].Blocked != 18 {
			t.Errorf("by region = %+v", res.ByRegion)
		}
		if len(res.TopClients) != 1 || res.TopClients[0] != (Top{Name: "c2", Blocked: 18, Total: 18}) {
			t.Errorf("top clients = %+v", res.TopClients)
		}
	}

	// Filters: one client, one day.
	res, err := mem.Query(context.Background(), Filter{Client: "c1", Start: day0.Add(24 * time.Hour), End: day0.Add(48 * time.Hour), Granularity: Day})
	if err != nil {
		t.Fatal(err)
	}
	if res.Summary.Total != 12 || res.Summary.Blocked != 0 || len(res.TopClients) != 0 {
		t.Errorf("client c1 on day 1: %+v", res)
	}
	if _, err := mem.Query(context.Background(), Filter{Start: end, End: day0}); !errors.Is(err, ErrBadFilter) {
		t.Errorf("end before start: err = %v, want ErrBadFilter", err)
	}
}

func TestMemoryRetentionAndBound(t *testing.T) {
	mem := NewMemory(MemoryConfig{Retention: time.Hour, MaxRows: 3})
	row := func(min int, client string) Rollup {
		return Rollup{Key: Key{Minute: day0.Add(time.Duration(min) * time.Minute).Unix(), Client: client}, Requests: 1}
	}
	now := day0.Add(2 * time.Hour)
	mem.Add(now, []Rollup{row(30, "old")}) // older than an hour before now
	if held, _ := mem.Rows(); held != 0 {
		t.Errorf("expired row held: %d rows", held)
	}
	mem.Add(now, []Rollup{row(70, "a"), row(71, "a"), row(71, "b"), row(72, "a")})
	held, evicted := mem.Rows()
	if held != 3 || evicted != 1 {
		t.Errorf("rows = %d, evicted %d; want 3 held, 1 evicted (minute 70 made room for 72)", held, evicted)
	}
	// Full, a row older than every minute held is the one dropped.
	mem.Add(now, []Rollup{row(65, "late")})
	held, evicted = mem.Rows()
	if held != 3 || evicted != 2 {
		t.Errorf("rows = %d, evicted %d; want 3 held, 2 evicted (the late row dropped)", held, evicted)
	}
	res, _ := mem.Query(context.Background(), Filter{Start: day0, End: now})
	if res.Summary.Total != 3 {
		t.Errorf("total = %d, want 3 (minutes 71 and 72)", res.Summary.Total)
	}
}

// stuckSink blocks every Write until release is closed, and fails while
// fail is set.
type stuckSink struct {
	release chan struct{}
	mu      sync.Mutex
	fail    bool
	rows    int64
	events  int
}

func (s *stuckSink) Write(ctx context.Context, rs []Rollup, blocked []Event) error {
	<-s.release
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("sink down")
	}
	for _, r := range rs {
		s.rows += r.Requests
	}
	s.events += len(blocked)
	return nil
}

func TestRecordDropsWhenFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &stuckSink{release: make(chan struct{})}
		rec := NewRecorder(Config{QueueSize: 4, Sink: sink, FlushInterval: time.Hour, Now: func() time.Time { return day0 }})
		ev := Event{Time: day0, Client: "c", Allowed: true}
		rec.Record(ev)
		// The first Flush parks the flusher in the stuck Write; the second
		// parks the aggregator behind it, so the queue fills.
		go rec.Flush(context.Background())
		synctest.Wait()
		go rec.Flush(context.Background())
		synctest.Wait()
		for range 4 + 10 {
			rec.Record(ev)
		}
		if got := rec.Stats().Dropped; got != 10 {
			t.Errorf("dropped = %d, want 10", got)
		}
		close(sink.release)
		if err := rec.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := rec.Stats()
		if st.Recorded != 5 || st.Dropped != 10 {
			t.Errorf("stats = %+v, want 5 recorded, 10 dropped", st)
		}
		if sink.rows != 5 {
			t.Errorf("sink got %d requests, want 5", sink.rows)
		}
		rec.Close()
	})
}

func TestSinkBacklogBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &stuckSink{release: make(chan struct{}), fail: true}
		close(sink.release)
		rec := NewRecorder(Config{Sink: sink, MaxBacklog: 2, FlushInterval: time.Hour, Now: func() time.Time { return day0 }})
		defer rec.Close()
		for i := range 5 {
			rec.Record(Event{Time: day0, Client: string(rune('a' + i)), Allowed: false})
		}
		rec.Flush(context.Background())
		st := rec.Stats()
		if st.SinkErrors != 1 || st.SinkBacklogRows != 2 || st.SinkDroppedRows != 3 || st.SinkDroppedEvents != 3 {
			t.Errorf("stats = %+v, want 1 error, 2 rows kept, 3 rows and 3 events dropped", st)
		}
		sink.mu.Lock()
		sink.fail = false
		sink.mu.Unlock()
		rec.Record(Event{Time: day0, Client: "z", Allowed: true})
		rec.Flush(context.Background())
		if st := rec.Stats(); st.SinkBacklogRows != 0 || sink.rows != 3 || sink.events != 2 {
			t.Errorf("after recovery: stats %+v, sink rows %d events %d; want 3 requests, 2 events", st, sink.rows, sink.events)
		}
		// The Memory store has everything, whatever the sink did.
		res, _ := rec.Memory().Query(context.Background(), Filter{Start: day0, End: day0.Add(time.Minute)})
		if res.Summary.Total != 6 {
			t.Errorf("memory total = %d, want 6", res.Summary.Total)
		}
	})
}

func TestSketchQuantile(t *testing.T) {
	var s Sketch
	for us := int64(1); us <= 1000; us++ {
		s.Add(us)
	}
	for _, tt := range []struct{ q, want float64 }{{0.5, 500}, {0.99, 990}} {
		got := s.Quantile(tt.q)
		if got < tt.want || got > tt.want*1.19 {
			t.Errorf("q%v = %v, want within 19%% above %v", tt.q, got, tt.want)
		}
	}
	if got := bucketOf(1 << 40); got != SketchBuckets-1 {
		t.Errorf("huge latency in bucket %d, want the last", got)
	}
}

// BenchmarkRecord measures the check path's cost: one Record from each
// parallel goroutine, the aggregator running. Events the aggregator could
// not keep up with are dropped, not waited for; drops/op says how many.
func BenchmarkRecord(b *testing.B) {
	rec := NewRecorder(Config{})
	defer rec.Close()
	ev := Event{Time: time.Now(), Client: "client-1", Resource: "/api/orders", Region: "eu-west", Rule: "per-client", Allowed: true, Cost: 1, Latency: 42 * time.Microsecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec.Record(ev)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(rec.Stats().Dropped)/float64(b.N), "drops/op")
}

// BenchmarkAggregate measures what the aggregator keeps up with: one
// producer records events of 1000 clients and waits for the aggregator
// every 4096 events, so that none is dropped; or of 10,000 clients,
// waiting every 40,000 events (a second at 40,000 checks a second, as the
// aggregator publishes). events/s is the figure, with the anomaly
// detector and without it.
func BenchmarkAggregate(b *testing.B) {
	for _, bc := range []struct {
		name                string
		maxKeys             int
		clients, flushEvery int
	}{{"detector", 0, 1000, 4096}, {"no-detector", -1, 1000, 4096}, {"clients-10000", 0, 10000, 40000}} {
		b.Run(bc.name, func(b *testing.B) {
			benchmarkAggregate(b, DetectorConfig{MaxKeys: bc.maxKeys}, bc.clients, bc.flushEvery)
		})
	}
}

func benchmarkAggregate(b *testing.B, det DetectorConfig, n, flushEvery int) {
	rec := NewRecorder(Config{QueueSize: 2 * flushEvery, Detector: det})
	defer rec.Close()
	clients := make([]string, n)
	for i := range clients {
		clients[i] = "client-" + strconv.Itoa(i)
	}
	ev := Event{Time: time.Now(), Resource: "/api/orders", Region: "eu-west", Allowed: true, Cost: 1, Latency: 42 * time.Microsecond}
	ctx := context.Background()
	b.ReportAllocs()
	start := time.Now()
	i := 0
	for b.Loop() {
		ev.Client = clients[i%len(clients)]
		rec.Record(ev)
		if i++; i%flushEvery == 0 {
			rec.Flush(ctx)
		}
	}
	rec.Flush(ctx)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	if d := rec.Stats().Dropped; d != 0 {
		b.Errorf("%d events dropped", d)
	}
}

func TestFlushEveryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &stuckSink{release: make(chan struct{})}
		close(sink.release)
		rec := NewRecorder(Config{Sink: sink, FlushInterval: 10 * time.Second})
		defer rec.Close()
		rec.Record(Event{Time: time.Now(), Client: "c", Allowed: false, Reason: ReasonOverLimit})
		synctest.Wait() // aggregated
		time.Sleep(9 * time.Second)
		synctest.Wait()
		sink.mu.Lock()
		if sink.rows != 0 {
			t.Errorf("written before the interval: %d", sink.rows)
		}
		sink.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		sink.mu.Lock()
		if sink.rows != 1 || sink.events != 1 {
			t.Errorf("after the interval: %d requests, %d events; want 1 and 1", sink.rows, sink.events)
		}
		sink.mu.Unlock()
		if st := rec.Stats(); st.SinkFlushes != 1 {
			t.Errorf("flushes = %d, want 1", st.SinkFlushes)
		}
	})
}

// TestRecordDropsOldest: a full queue makes room by dropping its oldest
// events, so the newest are the ones counted.
func TestRecordDropsOldest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &stuckSink{release: make(chan struct{})}
		mem := NewMemory(MemoryConfig{})
		rec := NewRecorder(Config{QueueSize: 3, Sink: sink, Memory: mem, FlushInterval: time.Hour, Now: func() time.Time { return day0 }})
		rec.Record(Event{Time: day0, Client: "first", Allowed: true})
		// Park the flusher in the stuck Write, then the aggregator behind it.
		go rec.Flush(context.Background())
		synctest.Wait()
		go rec.Flush(context.Background())
		synctest.Wait()
		for _, c := range []string{"a", "b", "c", "d", "e"} {
			rec.Record(Event{Time: day0, Client: c, Allowed: true})
		}
		close(sink.release)
		if err := rec.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := rec.Stats(); st.Dropped != 2 || st.Recorded != 4 {
			t.Errorf("stats = %+v, want 2 dropped, 4 recorded", st)
		}
		res, _ := mem.Query(context.Background(), Filter{Start: day0, End: day0.Add(time.Hour)})
		var got []string
		for _, c := range []string{"first", "a", "b", "c", "d", "e"} {
			if r, _ := mem.Query(context.Background(), Filter{Client: c, Start: day0, End: day0.Add(time.Hour)}); r.Summary.Total > 0 {
				got = append(got, c)
			}
		}
		if res.Summary.Total != 4 || strings.Join(got, ",") != "first,c,d,e" {
			t.Errorf("counted %d: %v, want first (aggregated before) and the newest c, d, e", res.Summary.Total, got)
		}
		rec.Close()
	})
}

// TestRecordAllocatesNothing: Record, on the check path, allocates
// nothing, whether the queue has room or is full (the oldest event is
// dropped). The Recorder here has no aggregator, whose allocations
// AllocsPerRun would count too.
func TestRecordAllocatesNothing(t *testing.T) {
	r := &Recorder{queue: make(chan Event, 16)}
	ev := Event{Time: day0, Client: "c1", Resource: "/r", Region: "eu", Allowed: true, Cost: 1}
	if n := testing.AllocsPerRun(1000, func() { r.Record(ev) }); n != 0 {
		t.Errorf("Record allocates %v times", n)
	}
	if r.dropped.Load() == 0 {
		t.Error("a full queue dropped nothing")
	}
}
