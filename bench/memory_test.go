package bench

import (
	"runtime"
	"testing"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
)

// heapAlloc returns the bytes of live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// measureBytesPerKey fills a fresh limiter with millionKeys keys through
// fill and returns the heap it grew by, per key. The key strings exist
// before the baseline, so they are not counted.
func measureBytesPerKey(b *testing.B, fill func(keys []string) any) float64 {
	keys := benchKeys()
	var sum float64
	for range b.N {
		before := heapAlloc()
		held := fill(keys)
		after := heapAlloc()
		runtime.KeepAlive(held)
		sum += float64(int64(after)-int64(before)) / millionKeys
	}
	return sum / float64(b.N)
}

// BenchmarkMemory reports the heap each key costs at a million keys, the
// key strings excluded; one operation fills a store with a million keys.
func BenchmarkMemory(b *testing.B) {
	for _, a := range sluice.Algorithms {
		b.Run(a.String(), func(b *testing.B) {
			v := measureBytesPerKey(b, func(keys []string) any {
				allow, st := newMemoryAllow(b, a)
				for _, k := range keys {
					if !allow(k, benchBase) {
						b.Fatalf("%s: first request for %q denied", a, k)
					}
				}
				if got := st.Len(); got != len(keys) {
					b.Fatalf("%s: store holds %d keys, want %d", a, got, len(keys))
				}
				return st
			})
			b.ReportMetric(v, "bytes/key")
		})
	}
	b.Run("x-time-rate", func(b *testing.B) {
		v := measureBytesPerKey(b, func(keys []string) any {
			r := &rateMap{m: make(map[string]*rate.Limiter)}
			for _, k := range keys {
				r.allow(k, benchBase)
			}
			return r
		})
		b.ReportMetric(v, "bytes/key")
	})
}
