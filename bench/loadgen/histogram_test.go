package loadgen

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	// 1..1000 µs, one each.
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.9, 900 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, time.Millisecond}} {
		got := time.Duration(h.quantile(tt.q))
		if diff := got - tt.want; diff < -tt.want/30 || diff > tt.want/30 {
			t.Errorf("quantile(%v) = %s, want %s within 3%%", tt.q, got, tt.want)
		}
	}
	if h.max != int64(time.Millisecond) {
		t.Errorf("max = %d", h.max)
	}
	for v := int64(0); v < 1<<40; v = v*3 + 1 {
		if b := bucketOf(v); valueOf(b) < v-v/30 || valueOf(b) > v+v/30+1 {
			t.Errorf("bucket of %d holds %d", v, valueOf(b))
		}
	}
}

// TestLatencyOfAnsweredRequests records an answer and a failure: only the
// answer's latency counts.
func TestLatencyOfAnsweredRequests(t *testing.T) {
	r := &run{cfg: Config{Target: TargetGRPC}, perKey: make([]atomic.Int64, 1), touched: make([]atomic.Bool, 1)}
	w := &worker{}
	now := time.Now()
	r.record(w, 0, 1, now.Add(-time.Millisecond), true, nil)
	r.record(w, 0, 1, now.Add(-time.Second), false, context.DeadlineExceeded)
	rep := r.report([]*worker{w}, time.Second, now)
	if rep.Allowed != 1 || rep.Errors != 1 {
		t.Fatalf("allowed %d errors %d, want 1 and 1", rep.Allowed, rep.Errors)
	}
	if rep.Latency == nil || rep.Latency.Max >= 500 {
		t.Errorf("latency %+v, want that of the answer alone (about 1 ms)", rep.Latency)
	}
}
