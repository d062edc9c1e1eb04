package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// algorithmsReady reports whether package algorithm decides (the memory
// store depends on it).
func algorithmsReady() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	p := algorithm.MustCompile(sluice.Limit{Algorithm: sluice.FixedWindow, Limit: 1, Window: time.Second})
	algorithm.Apply(&p, algorithm.State{}, 1, 1)
	return true
}

// newStore returns the store the engine tests run on: the real memory
// store, or, while package algorithm cannot decide yet, countStore.
func newStore(t testing.TB) Store {
	t.Helper()
	if !algorithmsReady() {
		return &countStore{m: map[string]*count{}}
	}
	s, err := memory.New(memory.Config{MaxKeys: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// countStore is a stand-in store: a fixed window of Params.Limit units per
// Params window for every algorithm, with the store contract's CheckAll
// semantics. It exists only until package algorithm lands.
type countStore struct {
	mu sync.Mutex
	m  map[string]*count
}

type count struct {
	window int64
	used   int64
}

func (s *countStore) decide(r *store.Request, commit bool) sluice.Decision {
	now := r.Now
	if now.IsZero() {
		now = time.Now()
	}
	w := r.Params.WindowDuration()
	win := now.UnixMicro() / w.Microseconds()
	c := s.m[r.Key]
	if c == nil || c.window != win {
		c = &count{window: win}
		s.m[r.Key] = c
	}
	reset := time.Duration((win+1)*w.Microseconds()-now.UnixMicro()) * time.Microsecond
	d := sluice.Decision{Limit: r.Params.Limit, ResetAfter: reset}
	switch {
	case r.Params.DenyAll:
		d.Reason = sluice.ReasonDenyAll
	case r.Cost > r.Params.Limit:
		d.Reason = sluice.ReasonCostExceedsCapacity
	case c.used+r.Cost > r.Params.Limit:
		d.Reason, d.RetryAfter = sluice.ReasonLimited, reset
	default:
		d.Allowed = true
		if commit {
			c.used += r.Cost
		}
	}
	d.Remaining = max(0, r.Params.Limit-c.used)
	if d.Allowed && !commit {
		d.Remaining = max(0, r.Params.Limit-c.used-r.Cost)
	}
	return d
}

func (s *countStore) Do(ctx context.Context, b *store.Batch) error {
	clear(b.Sources)
	if b.All {
		return s.checkAll(b.Reqs, b.Out)
	}
	return s.check(b.Reqs, b.Out)
}

func (s *countStore) Info() store.Info { return store.Info{} }

func (s *countStore) check(reqs []store.Request, out []sluice.Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range reqs {
		out[i] = s.decide(&reqs[i], true)
	}
	return nil
}

func (s *countStore) checkAll(reqs []store.Request, out []sluice.Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := true
	for i := range reqs {
		out[i] = s.decide(&reqs[i], false)
		ok = ok && out[i].Allowed
	}
	for i := range reqs {
		if ok {
			out[i] = s.decide(&reqs[i], true)
		} else if out[i].Allowed {
			out[i] = sluice.Decision{Reason: sluice.ReasonLimited, Limit: out[i].Limit, Remaining: out[i].Remaining + reqs[i].Cost, ResetAfter: out[i].ResetAfter}
		}
	}
	return nil
}

func (s *countStore) Reset(ctx context.Context, keys ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.m, k)
	}
	return nil
}

// flakyStore fails every call while down is set.
type flakyStore struct {
	Store
	down  atomic.Bool
	calls atomic.Int64
}

func (s *flakyStore) Do(ctx context.Context, b *store.Batch) error {
	s.calls.Add(1)
	if s.down.Load() {
		return fmt.Errorf("%w: test outage", sluice.ErrStoreUnavailable)
	}
	return s.Store.Do(ctx, b)
}

// onceStore adds store-kept idempotency records to a store, as a shared
// store (Redis) does, so that engines sharing it charge a key once.
type onceStore struct {
	Store
	mu      sync.Mutex
	records map[string]onceRecord
}

type onceRecord struct {
	out     []sluice.Decision
	expires time.Time
}

func (s *onceStore) Info() store.Info {
	info := s.Store.Info()
	info.SharedRecords = true
	return info
}

func (s *onceStore) Do(ctx context.Context, b *store.Batch) error {
	if b.Once == nil {
		return s.Store.Do(ctx, b)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := b.Reqs[0].Now
	if now.IsZero() {
		now = time.Now()
	}
	if r, ok := s.records[b.Once.Key]; ok && now.Before(r.expires) {
		copy(b.Out, r.out)
		b.Once.Replayed = true
		return nil
	}
	if err := s.Store.Do(ctx, &store.Batch{Reqs: b.Reqs, Out: b.Out, All: true}); err != nil {
		return err
	}
	s.records[b.Once.Key] = onceRecord{out: append([]sluice.Decision(nil), b.Out[:len(b.Reqs)]...), expires: now.Add(b.Once.TTL)}
	return nil
}
