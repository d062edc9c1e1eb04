package guard

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/store"
)

// BenchmarkGuard measures what the guard adds to a store call, on the
// memory store (which answers in about a microsecond, so the guard's own
// cost shows): direct is the store alone, guard the store through a guard
// with its defaults (deadline, breaker, over-limit cache), cached a check
// answered by the over-limit cache.
func BenchmarkGuard(b *testing.B) {
	inner := newMemory(b, nil)
	p := params(b, sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Limit: 1 << 40, Window: time.Minute})
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "rl:bench:{" + strconv.Itoa(i) + "}"
	}
	b.Run("direct", func(b *testing.B) {
		reqs := make([]store.Request, 1)
		out := make([]sluice.Decision, 1)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			reqs[0] = store.Request{Key: keys[i%len(keys)], Params: p, Cost: 1}
			if err := inner.CheckAll(context.Background(), reqs, out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guard", func(b *testing.B) {
		g := newGuard(b, inner, Config{Deadline: time.Second})
		reqs := make([]store.Request, 1)
		out := make([]sluice.Decision, 1)
		src := make([]engine.Source, 1)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			reqs[0] = store.Request{Key: keys[i%len(keys)], Params: p, Cost: 1}
			if err := g.CheckSourced(context.Background(), true, reqs, out, src); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		g := newGuard(b, inner, Config{Deadline: time.Second})
		tight := params(b, sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Hour})
		reqs := []store.Request{{Key: "rl:bench:tight", Params: tight, Cost: 1}}
		out := make([]sluice.Decision, 1)
		src := make([]engine.Source, 1)
		g.CheckSourced(context.Background(), true, reqs, out, src)
		g.CheckSourced(context.Background(), true, reqs, out, src)
		b.ReportAllocs()
		for b.Loop() {
			if err := g.CheckSourced(context.Background(), true, reqs, out, src); err != nil || src[0] != engine.SourceOverLimitCache {
				b.Fatal(err, src[0])
			}
		}
	})
}
