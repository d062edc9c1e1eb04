package engine

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store/memory"
)

// TestIdempotencySweptInBackground checks that expired idempotency
// records are dropped by the engine's own goroutine, with no new key
// arriving, that the map holding them is replaced once most are gone
// (its memory is freed), and that Close stops the goroutine (synctest
// fails a test whose bubble keeps a goroutine running).
func TestIdempotencySweptInBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := policy.Parse("t.yaml", []byte("version: 1\nrules:\n  - {id: r, limit: 100000, window: 1m, algorithm: fixed_window}\n"))
		if err != nil {
			t.Fatal(err)
		}
		st, err := memory.New(memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(Config{Store: st, Policy: p, IdempotencyTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		ctx := context.Background()
		const n = 3000 // past the 1024 at which a sweep may replace the map
		for i := range n {
			if _, err := e.Check(ctx, &Check{ClientID: "c", Cost: 1, IdempotencyKey: "k" + strconv.Itoa(i)}); err != nil {
				t.Fatal(err)
			}
		}
		size := func() int {
			e.idem.mu.Lock()
			defer e.idem.mu.Unlock()
			return len(e.idem.m)
		}
		if got := size(); got != n {
			t.Fatalf("%d records, want %d", got, n)
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if got := size(); got != n {
			t.Errorf("after 30s: %d records, want %d (not expired yet)", got, n)
		}
		time.Sleep(36 * time.Second) // past the TTL, and a tenth of it
		synctest.Wait()
		e.idem.mu.Lock()
		got, peak := len(e.idem.m), e.idem.peak
		e.idem.mu.Unlock()
		if got != 0 || peak != 0 {
			t.Errorf("after the TTL: %d records in a map that held %d, want 0 in a new map", got, peak)
		}
		// A repeat after the sweep is a new request.
		r, err := e.Check(ctx, &Check{ClientID: "c", Cost: 1, IdempotencyKey: "k1"})
		if err != nil || r.Source == SourceIdempotent {
			t.Errorf("repeat after expiry: %+v, %v; want decided anew", r, err)
		}
		e.Close()
		e.Close()
	})
}
