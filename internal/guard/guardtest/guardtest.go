// Package guardtest holds a store decorator that injects faults in
// process, for the unit tests of the guard and the engine: a store that is
// down, or slow. Fault tests against Redis use real processes and a real
// TCP proxy instead (see internal/guard's tests).
package guardtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// Store is what Faulty wraps, and what it is: the one interface of
// package store.
type Store = store.Store

// Faulty wraps a store and fails or delays its calls on demand. It honours
// its callers' deadlines, as the store contract asks. It is safe for
// concurrent use; the zero Faulty (with Inner set) passes every call
// through.
type Faulty struct {
	// Inner decides the calls that get through.
	Inner Store

	down  atomic.Bool
	delay atomic.Int64 // nanoseconds
	hang  atomic.Int64 // nanoseconds
	calls atomic.Int64
	keys  atomic.Int64 // requests that reached Inner
}

// SetDown makes every call fail at once with an error wrapping
// sluice.ErrStoreUnavailable (down) or pass (up).
func (f *Faulty) SetDown(down bool) { f.down.Store(down) }

// SetDelay makes every call wait d before it is decided (or until its
// context ends, whichever comes first).
func (f *Faulty) SetDelay(d time.Duration) { f.delay.Store(int64(d)) }

// SetHang makes every call block for d, ignoring its context, as a store
// that breaks its contract would (or a client blocked while it
// reconnects).
func (f *Faulty) SetHang(d time.Duration) { f.hang.Store(int64(d)) }

// Calls returns the number of calls made to f.
func (f *Faulty) Calls() int64 { return f.calls.Load() }

// Requests returns the number of requests that reached Inner.
func (f *Faulty) Requests() int64 { return f.keys.Load() }

func (f *Faulty) enter(ctx context.Context, n int) error {
	f.calls.Add(1)
	if d := time.Duration(f.hang.Load()); d > 0 {
		time.Sleep(d)
	}
	if d := time.Duration(f.delay.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, ctx.Err())
		}
	}
	if f.down.Load() {
		return fmt.Errorf("%w: injected outage", sluice.ErrStoreUnavailable)
	}
	f.keys.Add(int64(n))
	return nil
}

// Do implements store.Store.
func (f *Faulty) Do(ctx context.Context, b *store.Batch) error {
	if err := f.enter(ctx, len(b.Reqs)); err != nil {
		return err
	}
	return f.Inner.Do(ctx, b)
}

// Info implements store.Store: that of Inner.
func (f *Faulty) Info() store.Info { return f.Inner.Info() }

// Reset implements store.Store.
func (f *Faulty) Reset(ctx context.Context, keys ...string) error {
	if err := f.enter(ctx, 0); err != nil {
		return err
	}
	return f.Inner.Reset(ctx, keys...)
}
