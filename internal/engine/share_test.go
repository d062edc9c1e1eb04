package engine

import (
	"context"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/share"
)

const sharePolicy = `
version: 1
rules:
  - {id: bulk, match: {resource: /bulk}, dimension: client, algorithm: fixed_window, limit: 150, window: 1h}
  - {id: small, match: {resource: /small}, dimension: client, limit: 1000000000, window: 1h}
`

// TestBulkShareSameDecisions: batches held back by the bulk share (small
// checks in progress throughout, a share of a tenth) are decided as
// without it, all or nothing and best effort.
func TestBulkShareSameDecisions(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	held, _ := newEngine(t, sharePolicy)
	held.share = share.New(share.Config{Share: 0.1})
	free, _ := newEngine(t, sharePolicy)
	free.share = nil
	batch := func(n int, res string) []Check {
		cs := make([]Check, n)
		for i := range cs {
			cs[i] = Check{ClientID: "bulk", Resource: res, Cost: 1, Now: t0}
		}
		return cs
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, e := range []*Engine{held, free} {
		wg.Go(func() {
			for !stop.Load() {
				mustCheck(t, e, Check{ClientID: "small", Resource: "/small", Cost: 1})
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	for _, step := range []struct {
		mode BatchMode
		n    int
	}{{AllOrNothing, 100}, {AllOrNothing, 100}, {BestEffort, 100}, {AllOrNothing, 1000}, {BestEffort, 1000}, {AllOrNothing, 1000}} {
		var got [2][]Result
		for j, e := range []*Engine{held, free} {
			out, err := e.BatchCheck(context.Background(), batch(step.n, "/bulk"), step.mode)
			if err != nil {
				t.Fatal(err)
			}
			got[j] = out
		}
		for i := range got[0] {
			h, f := got[0][i], got[1][i]
			if h.Allowed != f.Allowed || h.Deciding.Remaining != f.Deciding.Remaining || h.Source != f.Source {
				t.Fatalf("mode %d, %d checks: check %d held back %+v, free %+v; want the same", step.mode, step.n, i, h, f)
			}
		}
	}
	if st := held.share.Stats(); st.Waits == 0 {
		t.Error("the batches never waited: the test shows nothing")
	} else {
		t.Logf("the batches waited %d times, %s", st.Waits, st.Waited)
	}
}

// BenchmarkCheckBulkShare is the cost of the bulk share on a single
// check, in process on the memory store: off, on with no large request
// in progress (one atomic load), and on while one is (the check counts
// itself); and the same from every CPU at once.
func BenchmarkCheckBulkShare(b *testing.B) {
	if !algorithmsReady() {
		b.Skip("package algorithm cannot decide yet")
	}
	c := Check{ClientID: "bench", User: "u1", Resource: "/api/v1/orders", Method: "GET", Cost: 1}
	for _, name := range []string{"off", "on", "on-bulk-in-progress"} {
		e := newBenchEngine(b)
		if name == "off" {
			e.share = nil
		} else if e.share == nil {
			b.Fatal("the bulk share is off by default")
		}
		if name == "on-bulk-in-progress" {
			turn := e.share.StartBulk(context.Background())
			b.Cleanup(turn.End)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c := c
				if _, err := e.Check(context.Background(), &c); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c := c
					if _, err := e.Check(context.Background(), &c); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkBulkRequests is the work in process of the large requests one
// client can send back to back, on the memory store with no small request
// about: an all-or-nothing batch of 1,000 checks of one key (merged into
// one store request), over its limit, its answer allocated (BatchCheck)
// or reused (BatchCheckInto, as the transports call it); Envoy's is
// envoyrls's BenchmarkBulkEnvoy. The fewer bytes they allocate, the fewer garbage
// collections they cause, which slow every other check of the process.
func BenchmarkBulkRequests(b *testing.B) {
	e, _ := newEngine(b, `
version: 1
rules:
  - {id: log, match: {resource: /attack}, dimension: client, algorithm: sliding_window_log, limit: 100, window: 1h}
`)
	ctx := context.Background()
	batch := make([]Check, MaxBatch)
	for i := range batch {
		batch[i] = Check{ClientID: "attacker", Resource: "/attack", Cost: 1}
	}
	b.Run("batch-1000-one-key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.BatchCheck(ctx, batch, AllOrNothing); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A transport's: the answer reused from batch to batch.
	b.Run("batch-1000-one-key-reused", func(b *testing.B) {
		b.ReportAllocs()
		var a BatchAnswer
		for b.Loop() {
			if err := e.BatchCheckInto(ctx, batch, AllOrNothing, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkBulkContended is a client's checks, one after another, while 8
// callers send all-or-nothing batches of 64 checks of one key back to
// back, over its limit, in process on the memory store: ns/op is the
// checks' mean latency, and it reports how often the waiting batches were
// woken, the garbage collections and the batches, per second.
func BenchmarkBulkContended(b *testing.B) {
	e, _ := newEngine(b, `
version: 1
rules:
  - {id: other, match: {resource: /other}, dimension: client, limit: 1000000000, window: 1h}
  - {id: attack, match: {resource: /attack}, dimension: client, algorithm: sliding_window_log, limit: 64, window: 1h}
`)
	if e.share == nil {
		b.Fatal("the bulk share is off by default")
	}
	ctx := context.Background()
	batch := make([]Check, 64)
	for i := range batch {
		batch[i] = Check{ClientID: "attacker", Resource: "/attack", Cost: 1}
	}
	var stop atomic.Bool
	var bulk atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				if _, err := e.BatchCheck(ctx, batch, AllOrNothing); err != nil {
					b.Error(err)
					return
				}
				bulk.Add(1)
			}
		})
	}
	c := Check{ClientID: "other", Resource: "/other", Cost: 1}
	waits0, bulk0, gc0 := e.share.Stats().Waits, bulk.Load(), gcCycles()
	start := time.Now()
	for b.Loop() {
		c := c
		if _, err := e.Check(ctx, &c); err != nil {
			b.Fatal(err)
		}
	}
	secs := time.Since(start).Seconds()
	b.ReportMetric(float64(e.share.Stats().Waits-waits0)/secs, "wakeups/s")
	b.ReportMetric(float64(gcCycles()-gc0)/secs, "gcs/s")
	b.ReportMetric(float64(bulk.Load()-bulk0)/secs, "bulk/s")
	stop.Store(true)
	wg.Wait()
}

// gcCycles returns the garbage collections the process has completed.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestBeginHoldsDecoding: while a small request is in progress, a request
// begun as large waits its turn before its transport decodes it
// (Engine.Begin), and its turn lasts until End; a small one begins at
// once; a request begun as large that holds few checks is decided as a
// small batch.
func TestBeginHoldsDecoding(t *testing.T) {
	if !algorithmsReady() {
		t.Skip("package algorithm cannot decide yet")
	}
	e, _ := newEngine(t, sharePolicy)
	e.share = share.New(share.Config{Share: 0.1})
	// owe starts a small request, which it returns, and 5ms of bulk work
	// while it is in progress: the next bulk slice waits some 40ms.
	owe := func() (small bool) {
		turn := e.share.StartBulk(context.Background())
		small = e.share.StartSmall()
		time.Sleep(5 * time.Millisecond)
		turn.End()
		return small
	}
	batch := func(client string, n int) []Check {
		cs := make([]Check, n)
		for i := range cs {
			cs[i] = Check{ClientID: client, Resource: "/bulk", Cost: 1, Now: t0}
		}
		return cs
	}
	var a BatchAnswer
	for _, tc := range []struct {
		name   string
		begun  int // the checks the transport expects
		checks []Check
		waits  bool
	}{
		{"large", 100, batch("a", 100), true},
		{"small", 16, batch("b", 100), false},
		{"begun large, of few checks", 100, batch("c", 3), true},
	} {
		small := owe()
		before := e.share.Stats().Waits
		e.Begin(context.Background(), tc.begun, &a)
		if got := e.share.Stats().Waits > before; got != tc.waits {
			t.Errorf("%s: waited its turn before decoding %v, want %v", tc.name, got, tc.waits)
		}
		err := e.BatchCheckInto(context.Background(), tc.checks, AllOrNothing, &a)
		a.End()
		e.share.EndSmall(small)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(a.Results) != len(tc.checks) {
			t.Fatalf("%s: %d results, want %d", tc.name, len(a.Results), len(tc.checks))
		}
		for i, r := range a.Results {
			if !r.Allowed {
				t.Errorf("%s: check %d denied: %+v", tc.name, i, r)
			}
		}
		if e.share.StartSmall() {
			t.Fatalf("%s: a large request is still in progress after End", tc.name)
		}
	}
}
