package guard

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicehq/sluice"
)

// TestBreakerAlone drives the breaker built from a BreakerConfig, without
// a guard or a store, in a testing/synctest bubble (gobreaker reads the
// wall clock, which is the bubble's): the ratio, the calls left out of it,
// Sustain, the open timeout and the probes.
func TestBreakerAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bs, err := BreakerConfig{Window: time.Minute, MinRequests: 10, FailureRatio: 0.5, OpenTimeout: 100 * time.Millisecond,
			Probes: 2, Sustain: 50 * time.Millisecond}.settings()
		if err != nil {
			t.Fatal(err)
		}
		cb := gobreaker.NewTwoStepCircuitBreaker[struct{}](*bs)
		failure := errors.Join(sluice.ErrStoreUnavailable, errors.New("down"))
		call := func(outcome error) error {
			done, err := cb.Allow()
			if err == nil {
				done(outcome)
			}
			return err
		}
		for range 10 {
			call(nil)
		}
		// Calls left out (cancelled by their callers, never sent) count
		// neither way: 100 of them, then 10 failures, meet the ratio.
		for range 100 {
			call(errCallerGone)
			call(errNotSent)
		}
		for range 10 {
			call(failure)
		}
		if s := fromGobreaker(cb.State()); s != BreakerClosed {
			t.Fatalf("ratio met, Sustain not passed: %s, want closed", s)
		}
		time.Sleep(50 * time.Millisecond)
		call(failure)
		if s := fromGobreaker(cb.State()); s != BreakerOpen {
			t.Fatalf("ratio met for Sustain: %s, want open", s)
		}
		if err := call(nil); !errors.Is(err, gobreaker.ErrOpenState) {
			t.Fatalf("open: Allow = %v, want ErrOpenState", err)
		}
		time.Sleep(100*time.Millisecond + time.Nanosecond)
		if s := fromGobreaker(cb.State()); s != BreakerHalfOpen {
			t.Fatalf("after the open timeout: %s, want half_open", s)
		}
		for i := range 2 {
			if err := call(nil); err != nil {
				t.Fatalf("probe %d: %v", i, err)
			}
		}
		if s := fromGobreaker(cb.State()); s != BreakerClosed {
			t.Fatalf("after 2 successful probes: %s, want closed", s)
		}
	})
}
