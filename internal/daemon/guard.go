package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/keyspace"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/store"
)

// guardStore wraps a shared store (Redis, Redis Cluster) in a guard: the
// per-call deadline, the circuit breaker, the over-limit cache and the
// hot-key tier. The memory store is returned as it is: it answers in
// process and cannot fail the way a network store does. The returned
// closer stops the guard, then closes the store.
//
// Before wrapping it, guardStore warms the store up within ctx (the
// start's context, not the checks' deadline): one read of keys spread
// over the slots opens the connections and loads the script on every
// node, so that the first checks do not miss their deadline doing it. A
// failed warm-up is only logged: the breaker and the failure modes take
// over. A pending store (see pendingRedis) is warmed up once it connects,
// by awaitStore.
func guardStore(ctx context.Context, rawURL string, st engine.Store, closer func() error, cfg guard.Config, m *metrics.Metrics, log *slog.Logger) (engine.Store, *guard.Guard, func() error, error) {
	if u, err := url.Parse(rawURL); err == nil && u.Scheme == "memory" {
		return st, nil, closer, nil
	}
	if _, pending := st.(*pendingRedis); !pending {
		if err := warmUp(ctx, st); err != nil {
			log.Warn("the store did not answer the warm-up; checks follow their failure modes until it does", "err", err)
		}
	}
	if cfg.Observer == nil {
		cfg.Observer = guardMetrics{m}
	}
	if user := cfg.OnBreakerChange; true {
		cfg.OnBreakerChange = func(from, to guard.BreakerState) {
			level := slog.LevelWarn
			if to == guard.BreakerClosed {
				level = slog.LevelInfo
			}
			log.Log(context.Background(), level, "store circuit breaker "+to.String(), "from", from.String())
			if user != nil {
				user(from, to)
			}
		}
	}
	g, err := guard.New(st, cfg)
	if err != nil {
		closer()
		return nil, nil, nil, fmt.Errorf("daemon: %w", err)
	}
	// gobreaker leaves the open state only when asked: a scrape asks, so
	// that an idle instance does not report a breaker open long after its
	// timeout.
	m.RefreshBreakerState(func() { g.BreakerState() })
	return g, g, func() error {
		g.Close()
		return closer()
	}, nil
}

// breakerState returns what reports the store's circuit breaker on GET
// /readyz: nil (no field) on the memory store.
func (d *Daemon) breakerState() func() string {
	if d.guard == nil {
		return nil
	}
	return func() string { return d.guard.BreakerState().String() }
}

// warmUp opens the connections of st and loads its script on every node:
// one read of keys spread over the slots, then concurrent ones, so that
// the client opens all its pipelined connections now rather than under the
// first burst of checks. It returns the first read's error.
func warmUp(ctx context.Context, st engine.Store) error {
	reqs := make([]store.Request, 32)
	for i := range reqs {
		reqs[i] = store.Request{Key: keyspace.WarmKey(i), Params: &warmParams}
	}
	if err := st.Do(ctx, &store.Batch{Reqs: reqs, Out: make([]sluice.Decision, len(reqs))}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for j := range 4 {
				r := [1]store.Request{reqs[(i+j)%len(reqs)]}
				var out [1]sluice.Decision
				st.Do(ctx, &store.Batch{Reqs: r[:], Out: out[:]})
			}
		})
	}
	wg.Wait()
	return nil
}

// awaitStore waits, until ctx ends, for the pending store to connect and
// then to answer (a cluster may still be forming): then, warmed up, the
// daemon reports itself serving on gRPC health. GET /readyz needs no word:
// it asks the store.
func (d *Daemon) awaitStore(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-d.pending.Connected():
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for logged := false; ; {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := warmUp(wctx, d.pending.Store())
		cancel()
		if err == nil {
			break
		}
		if !logged {
			d.log.Warn("the store connected but does not answer yet; checks follow their failure modes until it does", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	d.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
}

var warmParams = algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Second})

// guardMetrics feeds the guard's events to the metrics package. Store
// calls of checks are timed by the engine (around the guard), so
// StoreCall does nothing here; the hot keys' syncs, which the engine does
// not see, are timed as op "sync".
type guardMetrics struct{ m *metrics.Metrics }

func (g guardMetrics) BreakerChanged(to guard.BreakerState) {
	g.m.SetBreakerState(metrics.BreakerState(to))
}
func (g guardMetrics) StoreCall(time.Duration, error) {}
func (g guardMetrics) OverLimitCacheHit()             { g.m.OverLimitCacheHit() }
func (g guardMetrics) OverLimitEntries(n int)         { g.m.SetOverLimitCacheEntries(n) }
func (g guardMetrics) HotKeyDetected()                { g.m.HotKeyDetected() }
func (g guardMetrics) HotKeys(n int)                  { g.m.SetHotKeys(n) }
func (g guardMetrics) HotKeySync(lag time.Duration)   { g.m.HotKeySync(lag) }
func (g guardMetrics) HotKeySyncCall(d time.Duration, err error) {
	g.m.StoreCall(metrics.OpSync, d, err)
}
func (g guardMetrics) Gathered(n int) { g.m.StoreGathered(n) }
