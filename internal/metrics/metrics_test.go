package metrics

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice"
)

func TestNilSafe(t *testing.T) {
	var m *Metrics
	m.Decision("r", Allowed, "store")
	m.NearLimit("r", 10, 1)
	m.Check(APICheck, OutcomeAllowed, time.Millisecond)
	m.StoreCall(OpCheck, time.Millisecond, errors.New("x"))
	m.SetBreakerState(BreakerOpen)
	m.OverLimitCacheHit()
	m.SetOverLimitCacheEntries(1)
	m.SetHotKeys(1)
	m.HotKeyDetected()
	m.HotKeySync(time.Millisecond)
	m.ConfigApplied("v", time.Now(), time.Millisecond)
	m.ConfigFailed()
	m.Event("x", true)
	if m.Names() != nil {
		t.Error("Names of nil")
	}
}

func TestSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil {
		t.Error("registering twice: no error")
	}
	m.Decision("r1", Denied, "store")
	m.Decision("r1", Denied, "store")
	m.NearLimit("r1", 10, 3) // 70% used: not near
	m.NearLimit("r1", 10, 1) // 90% used
	m.StoreCall(OpCheckAll, time.Millisecond, fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, context.DeadlineExceeded))
	m.StoreCall(OpCheckAll, time.Millisecond, sluice.ErrStoreUnavailable)
	m.SetBreakerState(BreakerOpen)
	m.ConfigApplied("v1", time.Now(), time.Millisecond)
	m.ConfigApplied("v2", time.Now(), time.Millisecond)
	for _, tt := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.decisions.WithLabelValues("r1", "denied", "store"), 2},
		{m.nearLimit.WithLabelValues("r1"), 1},
		{m.storeErrors[OpCheckAll][KindTimeout], 1},
		{m.storeErrors[OpCheckAll][KindUnavailable], 1},
		{m.breakerState.state, 2},
		{m.reloads.WithLabelValues("success"), 2},
	} {
		if got := testutil.ToFloat64(tt.c); got != tt.want {
			t.Errorf("%v = %v, want %v", tt.c, got, tt.want)
		}
	}
	// Only the version in force has a config_info series.
	if n := testutil.CollectAndCount(m.configInfo); n != 1 {
		t.Errorf("config_info series = %d, want 1", n)
	}
	if m.Names()["sluice_check_duration_seconds"] != KindHistogram {
		t.Errorf("Names lacks the check histogram")
	}
}

func TestHotPathAllocations(t *testing.T) {
	m, _ := New(prometheus.NewRegistry())
	m.Decision("rule", Allowed, "store")
	allocs := testing.AllocsPerRun(1000, func() {
		m.Decision("rule", Allowed, "store")
		m.NearLimit("rule", 10, 1)
		m.Check(APICheck, OutcomeAllowed, time.Microsecond)
		m.StoreCall(OpCheckAll, time.Microsecond, nil)
	})
	if allocs != 0 {
		t.Errorf("allocations per check = %v, want 0", allocs)
	}
}

// BenchmarkCheckMetrics is what the engine records for one allowed check
// of one rule: decision, near-limit test, check and store latency.
func BenchmarkCheckMetrics(b *testing.B) {
	m, _ := New(prometheus.NewRegistry())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Decision("rule", Allowed, "store")
			m.NearLimit("rule", 100, 50)
			m.Check(APICheck, OutcomeAllowed, time.Microsecond)
			m.StoreCall(OpCheckAll, time.Microsecond, nil)
		}
	})
}
