package globalsync

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestStateBytesPerWindow reports the memory a window of another region's
// counts takes, two regions' counts each (docs/multi-region.md).
func TestStateBytesPerWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("measures memory")
	}
	const n = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := NewState(time.Minute, 20*time.Millisecond, 2*n)
	for i := range n {
		w := Window{Key: fmt.Sprintf("rl:partner:@g:{client=customer-%07d}", i), Start: 60_000, Length: time.Minute}
		s.Merge("us", w, 5, 60_100, 60_100)
		s.Merge("ap", w, 7, 60_100, 60_100)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per window of two other regions' counts (keys of 38 bytes)", per)
	if s.Windows() != n {
		t.Fatalf("%d windows", s.Windows())
	}
}
