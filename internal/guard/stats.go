package guard

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Stats are the guard's counters since New, for metrics and tests.
type Stats struct {
	// StoreCalls counts calls made to the store (checks, leases, resets).
	StoreCalls int64
	// GatheredCalls counts the store calls that decided gathered checks
	// (see Config.Gatherers), and GatheredJobs the checks they decided:
	// their ratio is the mean number of checks per call.
	GatheredCalls, GatheredJobs int64
	// StoreErrors counts store calls that failed (down, past the
	// deadline).
	StoreErrors int64
	// BreakerRefused counts calls refused by the breaker, with no network
	// call.
	BreakerRefused int64
	// OverLimitHits counts requests denied by the over-limit cache.
	OverLimitHits int64
	// HotAdmits and HotDenies count requests decided by the hot-key tier.
	HotAdmits, HotDenies int64
	// Syncs and SyncErrors count the hot-key tier's lease calls.
	Syncs, SyncErrors int64
	// HotKeys is the number of keys hot right now.
	HotKeys int
	// SyncLag is the time since the hot-key tier's last successful sync;
	// zero when the tier is off.
	SyncLag time.Duration
	// Breaker is the breaker's state now.
	Breaker BreakerState
	// StallTimeout is the stall timeout in force (see
	// Config.StallTimeout); zero when stall detection is off or at or
	// above the deadline.
	StallTimeout time.Duration
	// BreakerOpened and BreakerClosed count the breaker's transitions to
	// open and to closed; LastOpened and LastClosed are the latest.
	BreakerOpened, BreakerClosed int64
	LastOpened, LastClosed       time.Time
}

// Stats returns the guard's counters.
func (g *Guard) Stats() Stats {
	s := Stats{
		StoreCalls:     g.stats.storeCalls.Load(),
		StoreErrors:    g.stats.storeErrors.Load(),
		GatheredCalls:  g.stats.gatheredCalls.Load(),
		GatheredJobs:   g.stats.gatheredJobs.Load(),
		BreakerRefused: g.stats.refused.Load(),
		OverLimitHits:  g.stats.overLimitHits.Load(),
		HotAdmits:      g.stats.hotAdmits.Load(),
		HotDenies:      g.stats.hotDenies.Load(),
		Syncs:          g.stats.syncs.Load(),
		SyncErrors:     g.stats.syncErrors.Load(),
		BreakerOpened:  g.stats.opened.Load(),
		BreakerClosed:  g.stats.closed.Load(),
		Breaker:        g.BreakerState(),
		StallTimeout:   g.stall.timeout(),
	}
	if g.hot != nil {
		if m := g.hot.keys.Load(); m != nil {
			s.HotKeys = len(*m)
		}
		if last := g.hot.lastSync.Load(); last != 0 {
			s.SyncLag = time.Since(time.Unix(0, last))
		}
	}
	g.mu.Lock()
	s.LastOpened, s.LastClosed = g.lastOpened, g.lastClosed
	g.mu.Unlock()
	return s
}

// once runs b, a batch with an idempotency record, against a store that
// keeps the records: through the breaker and the deadline, and not
// through the over-limit cache or the hot-key tier.
func (g *Guard) once(ctx context.Context, b *store.Batch) error {
	j := g.newJob(opOnce, b.Reqs, len(b.Reqs))
	j.once = store.Once{Key: b.Once.Key, TTL: b.Once.TTL}
	replayed := false
	err := g.run(ctx, j, b.Out, &replayed)
	b.Once.Replayed = replayed
	return err
}
