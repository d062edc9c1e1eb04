package loadgen

import (
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
