package analytics

import "math/bits"

// sketchSubBuckets is the number of buckets per octave: 4 keeps a bucket's
// relative width at 2^(1/4)-1, about 19%.
const sketchSubBuckets = 4

// SketchBuckets is the number of buckets of a Sketch: bucket 0 holds
// latencies under 1µs, the last one everything from about 2^23µs (8s) up.
const SketchBuckets = 24*sketchSubBuckets + 1

// Sketch is a latency histogram of log-scale buckets, in microseconds. Two
// sketches merge by adding their buckets, so a percentile over many rollups
// is the percentile of their merged sketch. The zero value is empty. A
// Sketch is not safe for concurrent use.
type Sketch [SketchBuckets]uint32

// bucketOf returns the bucket of a latency of us microseconds.
func bucketOf(us int64) int {
	if us < 1 {
		return 0
	}
	u := uint64(us)
	exp := bits.Len64(u) - 1 // 2^exp <= u < 2^(exp+1)
	// The two bits under the leading one pick the quarter of the octave.
	var sub uint64
	if exp >= 2 {
		sub = (u >> (exp - 2)) & 3
	} else {
		sub = (u << (2 - exp)) & 3
	}
	b := 1 + exp*sketchSubBuckets + int(sub)
	if b >= SketchBuckets {
		return SketchBuckets - 1
	}
	return b
}

// bucketUpperUS returns the upper bound of bucket b, in microseconds: the
// value a percentile falling in b is reported as.
func bucketUpperUS(b int) float64 {
	if b == 0 {
		return 1
	}
	exp := (b - 1) / sketchSubBuckets
	sub := (b - 1) % sketchSubBuckets
	return float64(uint64(1)<<exp) * (1 + float64(sub+1)/sketchSubBuckets)
}

// Add counts one latency of us microseconds.
func (s *Sketch) Add(us int64) { s[bucketOf(us)]++ }

// Merge adds o's counts to s.
func (s *Sketch) Merge(o *Sketch) {
	for i := range s {
		s[i] += o[i]
	}
}

// Count returns the number of latencies counted.
func (s *Sketch) Count() uint64 {
	var n uint64
	for _, c := range s {
		n += uint64(c)
	}
	return n
}

// Quantile returns the q-quantile (0 < q <= 1) in microseconds, as the
// upper bound of the bucket that holds it, or 0 when s is empty.
func (s *Sketch) Quantile(q float64) float64 {
	n := s.Count()
	if n == 0 {
		return 0
	}
	rank := uint64(q*float64(n) + 0.5)
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range s {
		seen += uint64(c)
		if seen >= rank {
			return bucketUpperUS(i)
		}
	}
	return bucketUpperUS(SketchBuckets - 1)
}
