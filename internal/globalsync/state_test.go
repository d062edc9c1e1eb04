package globalsync

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var w0 = Window{Key: "global:orders", Start: 60_000, Length: time.Minute}

func TestWindowAt(t *testing.T) {
	for _, tc := range []struct {
		ms     int64
		length time.Duration
		want   Window
	}{
		{1_790_000_012_345, time.Minute, Window{"k", 1_789_999_980_000, time.Minute}},
		{1_790_000_040_000, time.Minute, Window{"k", 1_790_000_040_000, time.Minute}},
		{1_790_000_012_345, time.Second + 500*time.Microsecond, Window{"k", 1_790_000_012_000, time.Second}},
		{1_790_000_012_345, 0, Window{"k", 1_790_000_012_345, time.Millisecond}},
	} {
		if got := WindowAt("k", tc.length, time.UnixMilli(tc.ms)); got != tc.want {
			t.Errorf("WindowAt(%d, %v) = %+v, want %+v", tc.ms, tc.length, got, tc.want)
		}
	}
}

func TestMergeIsMaxPerOrigin(t *testing.T) {
	s := NewState(10*time.Second, 20*time.Millisecond, 1000)
	for _, step := range []struct {
		origin   string
		count    int64
		want     MergeResult
		wantSeen int64
	}{
		{"us", 10, Merged, 10},
		{"us", 10, Stale, 10}, // duplicate
		{"eu", 5, Merged, 15},
		{"us", 7, Stale, 15}, // backwards: an older count arriving late
		{"us", 12, Merged, 17},
		{"eu", 0, Stale, 17},
		{"ap", 3, Merged, 20},
	} {
		got := s.Merge(step.origin, w0, step.count, 61_000, 61_000)
		seen, _ := s.Others(w0, 61_000)
		if got != step.want || seen != step.wantSeen {
			t.Fatalf("Merge(%s, %d) = %v, seen %d; want %v, seen %d", step.origin, step.count, got, seen, step.want, step.wantSeen)
		}
	}
	if c, ok := s.Count("us", w0); c != 12 || !ok {
		t.Errorf("Count(us) = %d, %v; want 12, true", c, ok)
	}
	if _, ok := s.Count("nowhere", w0); ok {
		t.Errorf("Count(nowhere) found a count")
	}
}

// The merged counts are the same whatever the order and the number of
// times each update arrives.
func TestMergeOrderAndDuplicatesDoNotMatter(t *testing.T) {
	type update struct {
		origin string
		w      Window
		count  int64
	}
	var updates []update
	want := map[Window]int64{}
	for _, o := range []string{"us", "eu", "ap"} {
		for k := range 5 {
			w := Window{Key: string(rune('a' + k)), Start: 60_000, Length: time.Minute}
			var c int64
			for range 20 {
				c += int64(rand.IntN(5))
				updates = append(updates, update{o, w, c})
			}
			want[w] += c
		}
	}
	for trial := range 20 {
		s := NewState(10*time.Second, 20*time.Millisecond, 1000)
		order := rand.Perm(len(updates))
		for _, i := range order {
			u := updates[i]
			for range 1 + rand.IntN(3) {
				s.Merge(u.origin, u.w, u.count, 61_000, 61_000)
			}
		}
		for w, c := range want {
			if seen, _ := s.Others(w, 61_000); seen != c {
				t.Fatalf("trial %d: %s: seen %d, want %d", trial, w.Key, seen, c)
			}
		}
	}
}

func TestStateIsBounded(t *testing.T) {
	s := NewState(10*time.Second, 20*time.Millisecond, 2)
	next := Window{Key: w0.Key, Start: w0.Start + 60_000, Length: w0.Length}
	other := Window{Key: "global:other", Start: w0.Start, Length: w0.Length}
	for _, step := range []struct {
		w    Window
		want MergeResult
	}{
		{w0, Merged},
		{other, Merged},
		{next, Full},
		{w0, Stale}, // a window held still takes counts
	} {
		if got := s.Merge("us", step.w, 5, 61_000, 61_000); got != step.want {
			t.Errorf("Merge(%s at %d) = %v, want %v", step.w.Key, step.w.Start, got, step.want)
		}
	}
	s.Sweep(w0.end() + 10_000) // w0 and other expire: room for next
	if got := s.Merge("us", next, 5, 121_000, 121_000); got != Merged {
		t.Errorf("Merge after the sweep = %v, want Merged", got)
	}
	if n := s.Windows(); n != 1 {
		t.Errorf("%d windows held, want 1", n)
	}
}

func TestWindowsExpire(t *testing.T) {
	s := NewState(10*time.Second, 20*time.Millisecond, 1000)
	s.Merge("us", w0, 5, 61_000, 61_000)
	end := w0.Start + w0.Length.Milliseconds()
	if n := s.Sweep(end + 9_999); n != 1 {
		t.Fatalf("Sweep before end+grace kept %d windows, want 1", n)
	}
	if n := s.Sweep(end + 10_000); n != 0 {
		t.Fatalf("Sweep at end+grace kept %d windows, want 0", n)
	}
	if seen, _ := s.Others(w0, end+10_000); seen != 0 {
		t.Errorf("seen %d after the sweep, want 0", seen)
	}
	// A late redelivery does not bring an expired window back.
	if got := s.Merge("us", w0, 6, 61_000, end+10_001); got != Expired {
		t.Errorf("Merge into an expired window = %v, want Expired", got)
	}
	if n := s.Sweep(end + 10_001); n != 0 {
		t.Errorf("expired window came back: %d windows", n)
	}
}

// An origin sending 100 per second for a key gets a reserve of about
// rate × (lag + flush), which carries into the key's next window.
func TestReserveFollowsRateAndLag(t *testing.T) {
	s := NewState(10*time.Second, 20*time.Millisecond, 1000)
	s.SetLag("us", 80)
	now := w0.Start
	var count int64
	for now < w0.Start+5_000 { // 5s at 100/s, a batch every 20ms
		now += 20
		count += 2
		s.Merge("us", w0, count, now-80, now)
	}
	seen, r := s.Others(w0, now)
	if seen != count {
		t.Fatalf("seen %d, want %d", seen, count)
	}
	// 0.1/ms × (80 + 20) ms = 10
	if r < 9 || r > 11 {
		t.Errorf("reserve %d, want about 10", r)
	}
	next := Window{Key: w0.Key, Start: w0.Start + 60_000, Length: w0.Length}
	if seen, r := s.Others(next, now); seen != 0 || r < 9 || r > 11 {
		t.Errorf("next window before any count: seen %d, reserve %d; want 0 and about 10", seen, r)
	}
	// Heard for 10s (heartbeats) with no new count: the origin admitted
	// nothing, the reserve fades.
	s.Heard("us", now+10_000)
	if _, r := s.Others(w0, now+10_000); r > 1 {
		t.Errorf("reserve after 10s heard without a new count %d, want at most 1", r)
	}
	// Unheard for 10s: it may have gone on admitting; within a share of
	// a limit of 1,500 between us and this region, up to 750.
	s2 := NewState(time.Minute, 20*time.Millisecond, 1000)
	s2.Heard("us", now-10)
	s2.Merge("us", w0, count, now-80, now)
	if seen, r := s2.OthersWithin(w0, 1500, now+10_000); seen != count || r != 750-count {
		t.Errorf("unheard for 10s: seen %d, reserve %d; want %d and its share less that, %d", seen, r, count, 750-count)
	}
}

func TestReserve(t *testing.T) {
	for _, tc := range []struct {
		rate             float64 // per ms
		lag, flush, idle int64
		want             float64
	}{
		{0, 100, 20, 0, 0},
		{math.NaN(), 100, 20, 0, 0},
		{-1, 100, 20, 0, 0},
		{1, 100, 20, 0, 120},
		{1, 100, 20, 140, 120},         // within lag + 2 flush: full
		{1, 100, 20, 280, 60},          // twice the horizon: half
		{0.5, -5, 20, 10, 10},          // a negative lag (clock skew) counts as none
		{2, 0, 0, 0, 0},                // no lag, no batching: nothing unseen
		{1, 1000, 20, 1_040_000, 1.02}, // long silence: almost nothing
	} {
		if got := reserve(tc.rate, tc.lag, tc.flush, tc.idle); math.Abs(got-tc.want) > 1e-9 && !(math.IsNaN(tc.want) && math.IsNaN(got)) {
			t.Errorf("reserve(%v, lag %d, flush %d, idle %d) = %v, want %v", tc.rate, tc.lag, tc.flush, tc.idle, got, tc.want)
		}
	}
}

func TestEWMA(t *testing.T) {
	// A steady 0.1/ms converges to 0.1/ms whatever the batch interval.
	for _, dt := range []int64{10, 20, 200} {
		r := 0.0
		for range 100_000 / dt {
			r = ewma(r, dt/10, dt) // 0.1 per ms, in whole counts
		}
		if math.Abs(r-0.1) > 1e-3 {
			t.Errorf("dt %d: rate %v, want 0.1", dt, r)
		}
	}
	// Half-life: a step from 0 to 1/ms is half taken in after rateHalfLife.
	r := 0.0
	for range rateHalfLife / 10 {
		r = ewma(r, 10, 10)
	}
	if math.Abs(r-0.5) > 0.01 {
		t.Errorf("after one half-life: rate %v, want 0.5", r)
	}
	// Two batches at the same instant add delta/τ, not infinity.
	if got := ewma(0, 10, 0); math.IsInf(got, 0) || got <= 0 || got > 10/rateTau+1e-12 {
		t.Errorf("ewma(0, 10, 0) = %v, want 10/τ", got)
	}
	if got := ewma(1, -5, 10); got > 1 {
		t.Errorf("a decrease raised the rate to %v", got)
	}
}
