package events

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logging"
)

// collect is a Sink that keeps what it receives.
type collect struct {
	mu  sync.Mutex
	evs []Event
}

func (c *collect) Emit(ev *Event) {
	c.mu.Lock()
	c.evs = append(c.evs, *ev)
	c.mu.Unlock()
}

func (c *collect) count(t Type) int {
	n := 0
	for _, ev := range c.evs {
		if ev.Type == t {
			n++
		}
	}
	return n
}

var t0 = time.Unix(1_800_000_000, 0)

func TestBurstRule(t *testing.T) {
	var c collect
	r := New(Config{Sinks: []Sink{&c}, SampleFirst: -1, BurstWarn: 3, BurstBlock: 5, BurstWindow: 10 * time.Second})
	d := &Denial{Rule: "r", ClientID: "a"}
	for i := range 6 {
		r.Denied(context.Background(), t0.Add(time.Duration(i)*time.Second), d)
	}
	if got := c.count(RateLimitExceeded); got != 6 {
		t.Errorf("rate_limit_exceeded = %d, want 6", got)
	}
	if c.count(BurstWarning) != 1 || c.count(BurstBlocked) != 1 {
		t.Errorf("burst events: warning %d blocked %d, want 1 and 1", c.count(BurstWarning), c.count(BurstBlocked))
	}
	for _, ev := range c.evs {
		if ev.Type == BurstBlocked && (ev.Count != 5 || ev.Severity != SeverityError || ev.WindowMS != 10_000) {
			t.Errorf("blocked event = %+v", ev)
		}
	}
	// Another key, and the next window, start from zero.
	r.Denied(context.Background(), t0.Add(7*time.Second), &Denial{Rule: "r", ClientID: "b"})
	for i := range 2 {
		r.Denied(context.Background(), t0.Add(10*time.Second+time.Duration(i)), d)
	}
	if c.count(BurstWarning) != 1 {
		t.Errorf("warning after a new window with 2 denials: %d, want still 1", c.count(BurstWarning))
	}
}

func TestBurstDetectorBoundedKeys(t *testing.T) {
	b := newBurstDetector(Config{BurstMaxKeys: 32})
	for i := range 10_000 {
		b.denied(t0, &Denial{Rule: "r", ClientID: string(rune('a' + i%26)), User: string(rune(i))})
	}
	n := 0
	for i := range b.shards {
		n += len(b.shards[i].counts)
	}
	if n > 32 {
		t.Errorf("tracked %d keys, want at most 32", n)
	}
}

func TestSampling(t *testing.T) {
	var c collect
	r := New(Config{Sinks: []Sink{&c}, SampleFirst: 10, SampleThereafter: 100, BurstWarn: -1})
	for range 1010 {
		r.Emit(Event{Type: RateLimitExceeded, Time: t0})
	}
	// 10 first, then the 100th, 200th, ... of the 1000 after them.
	if got := c.count(RateLimitExceeded); got != 20 {
		t.Errorf("sampled %d, want 20", got)
	}
	// The next second starts over; config events are never sampled.
	r.Emit(Event{Type: RateLimitExceeded, Time: t0.Add(time.Second)})
	for range 50 {
		r.Emit(Event{Type: ConfigUpdated, Time: t0})
	}
	if c.count(RateLimitExceeded) != 21 || c.count(ConfigUpdated) != 50 {
		t.Errorf("exceeded %d config %d, want 21 and 50", c.count(RateLimitExceeded), c.count(ConfigUpdated))
	}
}

func TestRing(t *testing.T) {
	r := NewRing(3)
	for i := range 5 {
		r.Emit(&Event{Type: ConfigUpdated, Count: int64(i)})
	}
	evs, total := r.Last(10, nil)
	if total != 5 || len(evs) != 3 || evs[0].Count != 4 || evs[2].Count != 2 {
		t.Errorf("Last = %v, %d; want counts 4,3,2 of 5", evs, total)
	}
	evs, _ = r.Last(10, func(ev *Event) bool { return ev.Count%2 == 0 })
	if len(evs) != 2 {
		t.Errorf("filtered = %v", evs)
	}
}

func TestNilRecorder(t *testing.T) {
	var r *Recorder
	r.Emit(Event{Type: ConfigUpdated})
	r.Denied(context.Background(), t0, &Denial{})
}

func BenchmarkDeniedSampledOut(b *testing.B) {
	r := New(Config{Sinks: []Sink{NewRing(100)}})
	d := &Denial{Rule: "r", ClientID: "a"}
	b.ReportAllocs()
	for b.Loop() {
		r.Denied(context.Background(), t0, d)
	}
}

// TestDenialEventsCarryRequestID checks that the events of a denial carry
// the request id of its context, on the event, in the JSON of GET
// /api/v1/events and in the log line as request_id, as every other line
// about the request; and that events of no request carry none.
func TestDenialEventsCarryRequestID(t *testing.T) {
	var c collect
	var buf bytes.Buffer
	log, err := logging.New(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	r := New(Config{Sinks: []Sink{&c, NewLogSink(log)}, SampleFirst: -1, BurstWarn: 2, BurstBlock: 3})
	ctx := logging.With(context.Background(), slog.String(logging.RequestIDKey, "req-7"))
	d := &Denial{Rule: "r", ClientID: "a"}
	for range 3 {
		r.Denied(ctx, t0, d)
	}
	r.Denied(context.Background(), t0, &Denial{Rule: "r", ClientID: "b"})
	r.Emit(Event{Type: ConfigUpdated, Time: t0, Severity: SeverityInfo, Version: "v2"})
	want := map[Type]int{RateLimitExceeded: 3, BurstWarning: 1, BurstBlocked: 1}
	for _, ev := range c.evs {
		if ev.ClientID == "a" {
			want[ev.Type]--
			if ev.RequestID != "req-7" {
				t.Errorf("%s event of the request: request id %q, want req-7", ev.Type, ev.RequestID)
			}
		} else if ev.RequestID != "" {
			t.Errorf("%s event of %q: request id %q, want none", ev.Type, ev.ClientID, ev.RequestID)
		}
	}
	for typ, n := range want {
		if n != 0 {
			t.Errorf("%s events of the request: %d missing", typ, n)
		}
	}
	if b, _ := json.Marshal(c.evs[0]); !strings.Contains(string(b), `"request_id":"req-7"`) {
		t.Errorf("JSON %s, want request_id", b)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 7 {
		t.Fatalf("%d log lines, want 7:\n%s", len(lines), buf.String())
	}
	for _, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		id, has := m[logging.RequestIDKey]
		if ofRequest := m["client_id"] == "a"; ofRequest != has || (has && id != "req-7") {
			t.Errorf("log line %s: request_id %v, want req-7 exactly on the lines of the request", line, id)
		}
	}
}
