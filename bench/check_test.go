package bench

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// The limit of every in-memory benchmark: 1000 per second, bursts of 1000.
const (
	benchLimit  = 1000
	benchWindow = time.Second
	// millionKeys is the key count of the million-keys workload and of
	// BenchmarkMemory.
	millionKeys = 1_000_000
	// benchMaxKeys is the key bound of the stores under benchmark: above
	// millionKeys, so that no benchmark measures eviction.
	benchMaxKeys = 2 * millionKeys
)

// benchBase is the first instant of every benchmark; each operation of one
// goroutine advances its own clock by benchStep.
var benchBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const benchStep = time.Microsecond

var (
	keysOnce  sync.Once
	keysSlice []string
)

// benchKeys returns millionKeys distinct key strings, built once per process
// so that no benchmark times their construction.
func benchKeys() []string {
	keysOnce.Do(func() {
		keysSlice = make([]string, millionKeys)
		for i := range keysSlice {
			keysSlice[i] = "user:" + strconv.Itoa(i)
		}
	})
	return keysSlice
}

// allowFunc decides one request of cost 1 for key at t. Every limiter under
// benchmark is called through one, so that all pay the same indirect call.
type allowFunc func(key string, t time.Time) bool

// runWorkload runs the named workload against allow.
func runWorkload(b *testing.B, workload string, allow allowFunc) {
	keys := benchKeys()
	b.ReportAllocs()
	b.ResetTimer()
	switch workload {
	case "one-key":
		t := benchBase
		for range b.N {
			allow(keys[0], t)
			t = t.Add(benchStep)
		}
	case "million-keys":
		t := benchBase
		for i := range b.N {
			allow(keys[i%millionKeys], t)
			t = t.Add(benchStep)
		}
	case "parallel-keys":
		var next atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine walks the keys from its own offset.
			i := int(next.Add(1)*7919*131) % millionKeys
			t := benchBase
			for pb.Next() {
				allow(keys[i], t)
				t = t.Add(benchStep)
				if i++; i == millionKeys {
					i = 0
				}
			}
		})
	case "parallel-one-key":
		b.RunParallel(func(pb *testing.PB) {
			t := benchBase
			for pb.Next() {
				allow(keys[0], t)
				t = t.Add(benchStep)
			}
		})
	default:
		b.Fatalf("unknown workload %q", workload)
	}
}

var workloads = []string{"one-key", "million-keys", "parallel-keys", "parallel-one-key"}

// benchLimitOf returns the benchmark limit for algorithm a.
func benchLimitOf(a sluice.Algorithm) sluice.Limit {
	return sluice.Limit{Algorithm: a, Limit: benchLimit, Window: benchWindow}
}

// newMemoryAllow returns an allowFunc deciding through a fresh memory store.
func newMemoryAllow(b *testing.B, a sluice.Algorithm) (allowFunc, *memory.Store) {
	p, err := algorithm.Compile(benchLimitOf(a))
	if err != nil {
		b.Fatal(err)
	}
	st, err := memory.New(memory.Config{MaxKeys: benchMaxKeys})
	if err != nil {
		b.Fatal(err)
	}
	return func(key string, t time.Time) bool {
		d, err := st.Decide(store.Request{Key: key, Params: &p, Cost: 1, Now: t})
		if err != nil {
			b.Error(err) // not Fatal: this may run in a RunParallel goroutine
		}
		return d.Allowed
	}, st
}

// BenchmarkCheck measures one check of the memory store per operation, for
// every algorithm and workload.
func BenchmarkCheck(b *testing.B) {
	benchKeys()
	for _, a := range sluice.Algorithms {
		b.Run(a.String(), func(b *testing.B) {
			for _, w := range workloads {
				b.Run(w, func(b *testing.B) {
					allow, st := newMemoryAllow(b, a)
					defer st.Close()
					runWorkload(b, w, allow)
				})
			}
		})
	}
}

// rateMap is how a user keeps one golang.org/x/time/rate limiter per key: a
// map behind a mutex, filled on first use.
type rateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (r *rateMap) allow(key string, t time.Time) bool {
	r.mu.Lock()
	l := r.m[key]
	if l == nil {
		l = rate.NewLimiter(rate.Every(benchWindow/benchLimit), benchLimit)
		r.m[key] = l
	}
	r.mu.Unlock()
	return l.AllowN(t, 1)
}

// newThrottled returns throttled's GCRA limiter on its memory store, with
// the benchmark limit. The store reads the wall clock itself, and has no key
// bound (a bound makes it an LRU behind one lock).
func newThrottled(b *testing.B) *throttled.GCRARateLimiterCtx {
	st, err := memstore.NewCtx(0)
	if err != nil {
		b.Fatal(err)
	}
	rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(benchLimit), MaxBurst: benchLimit - 1})
	if err != nil {
		b.Fatal(err)
	}
	return rl
}

// BenchmarkReference runs the workloads of BenchmarkCheck through other Go
// rate limiters, for comparison in the same run.
func BenchmarkReference(b *testing.B) {
	benchKeys()
	b.Run("x-time-rate", func(b *testing.B) {
		for _, w := range workloads {
			b.Run(w, func(b *testing.B) {
				r := &rateMap{m: make(map[string]*rate.Limiter)}
				runWorkload(b, w, r.allow)
			})
		}
	})
	b.Run("throttled", func(b *testing.B) {
		for _, w := range workloads {
			b.Run(w, func(b *testing.B) {
				rl := newThrottled(b)
				ctx := context.Background()
				runWorkload(b, w, func(key string, _ time.Time) bool {
					// Under contention on one key, throttled gives up after
					// its compare-and-swap attempts and returns an error:
					// count that as a denial, as a caller would.
					limited, _, err := rl.RateLimitCtx(ctx, key, 1)
					return err == nil && !limited
				})
			})
		}
	})
	benchReferenceRedis(b)
}
