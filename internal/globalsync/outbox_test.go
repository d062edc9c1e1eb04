package globalsync

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestOutbox(t *testing.T) {
	o := newOutbox(3)
	ws := make([]Window, 5)
	for i := range ws {
		ws[i] = Window{Key: fmt.Sprint("k", i), Start: 60_000, Length: time.Minute}
		o.observe(ws[i], 10)
	}
	o.observe(ws[0], 12)
	o.observe(ws[0], 11) // backwards: ignored
	o.observe(Window{Key: strings.Repeat("k", MaxKeyLen+1), Length: time.Minute}, 1)
	if got := o.dropped.Load(); got != 3 {
		t.Errorf("dropped %d, want 3 (two past the bound, one too long a key)", got)
	}
	sent := o.take(nil)
	if len(sent) != 3 || o.pending() != 3 {
		t.Fatalf("took %v with %d pending, want 3 windows, 3 pending", sent, o.pending())
	}
	slices.SortFunc(sent, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	if sent[0].Key != "k0" || sent[0].Count != 12 {
		t.Errorf("took %v, want k0 at its newest count 12", sent)
	}
	if again := o.take(nil); len(again) != 0 {
		t.Errorf("took %v again without new counts", again)
	}
	// One publish (k0, k1) fails, one (k2) succeeds: the failed windows
	// come back with their newest count.
	o.observe(ws[1], 15)
	o.failed(sent[:2])
	o.acked(sent[2:])
	again := o.take(nil)
	if len(again) != 2 || o.pending() != 2 {
		t.Fatalf("after a failure took %v with %d pending, want 2 windows, 2 pending", again, o.pending())
	}
	for _, e := range again {
		if e.Key == "k1" && e.Count != 15 {
			t.Errorf("k1 sent again at %d, want its newest count 15", e.Count)
		}
	}
	o.acked(again)
	if p := o.pending(); p != 0 {
		t.Errorf("%d pending after all acknowledged, want 0", p)
	}
	// Full and all acknowledged: the sweep makes room.
	o.sweep(61_000, 10_000)
	if o.size.Load() != 0 {
		t.Errorf("%d windows held after the sweep, want 0", o.size.Load())
	}
	o.observe(ws[4], 1)
	if got := o.dropped.Load(); got != 3 {
		t.Errorf("dropped %d after room was made, want still 3", got)
	}
	// Expired windows go, acknowledged or not.
	o.sweep(ws[4].end()+10_000, 10_000)
	if len(o.take(nil)) != 0 || o.size.Load() != 0 {
		t.Errorf("an expired window is still held or sent")
	}
}

func TestObserveDoesNotAllocate(t *testing.T) {
	o := newOutbox(100)
	w := Window{Key: "global:orders", Start: 60_000, Length: time.Minute}
	var c int64
	o.observe(w, c)
	allocs := testing.AllocsPerRun(1000, func() {
		c++
		o.observe(w, c)
		if c%100 == 0 {
			o.take(make([]Entry, 0, 1))
		}
	})
	if allocs > 0.02 { // the one make per 100 runs
		t.Errorf("observe allocates %v times per call", allocs)
	}
	s := NewState(10*time.Second, 20*time.Millisecond, 1000)
	s.Merge("eu", w, 5, 60_500, 60_500)
	if a := testing.AllocsPerRun(1000, func() { s.Others(w, 61_000) }); a != 0 {
		t.Errorf("Others allocates %v times per call", a)
	}
}

func TestP95(t *testing.T) {
	for _, tc := range []struct {
		lags []int64
		want int64
	}{
		{nil, 0},
		{[]int64{7}, 7},
		{[]int64{5, 1, 3}, 5},
		{func() []int64 {
			l := make([]int64, 100)
			for i := range l {
				l[i] = int64(100 - i)
			}
			return l
		}(), 95},
	} {
		if got := p95(tc.lags); got != tc.want {
			t.Errorf("p95(%v) = %d, want %d", tc.lags, got, tc.want)
		}
	}
}
