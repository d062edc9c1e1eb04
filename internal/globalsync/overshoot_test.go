package globalsync

import (
	"testing"
	"time"
)

// simulate runs regions admitting requests of one global limit for one
// window, each deciding from its own count and a State fed with the
// others' counts after a lag, and returns the total admitted. rates are
// the requests each region receives per ms. useReserve false decides on
// the seen counts alone.
func simulate(t *testing.T, limit int64, rates []int64, lag, flush int64, useReserve bool) int64 {
	t.Helper()
	w := Window{Key: "global:sim", Start: 600_000, Length: 10 * time.Second}
	names := []string{"us", "eu", "ap", "sa"}[:len(rates)]
	states := make([]*State, len(rates))
	for i := range states {
		states[i] = NewState(10*time.Second, time.Duration(flush)*time.Millisecond)
		for j := range rates {
			if j != i {
				states[i].SetLag(names[j], lag)
			}
		}
	}
	type delivery struct {
		at, sentAt int64
		from, to   int
		count      int64
	}
	var inflight []delivery
	own := make([]int64, len(rates))
	for now := w.Start; now < w.end(); now++ {
		for _, d := range inflight {
			if d.at == now {
				states[d.to].Merge(names[d.from], w, d.count, d.sentAt, now)
			}
		}
		for i, rate := range rates {
			seen, reserve := states[i].Others(w, now)
			if !useReserve {
				reserve = 0
			}
			for range rate {
				if own[i]+seen+reserve < limit {
					own[i]++
				}
			}
		}
		if (now-w.Start)%flush == flush-1 {
			for i := range rates {
				for j := range rates {
					if j != i {
						inflight = append(inflight, delivery{at: now + lag, sentAt: now, from: i, to: j, count: own[i]})
					}
				}
			}
		}
	}
	var total int64
	for _, c := range own {
		total += c
	}
	return total
}

// The reserve bounds the overshoot with lag: three regions with steady
// traffic, 100ms apart, exhaust a limit mid-window. Without the reserve
// each admits what the others sent in the last lag and flush period;
// with it, the overshoot is what the estimate misses.
func TestReserveBoundsOvershoot(t *testing.T) {
	const limit, lag, flush = 20_000, 100, 20
	rates := []int64{3, 2, 1} // per ms: 6,000 a second together
	without := simulate(t, limit, rates, lag, flush, false) - limit
	with := simulate(t, limit, rates, lag, flush, true) - limit
	// On paper, without a reserve: up to Σ_{o≠j} a_o·(lag+flush), 3·120 = 360
	// for the slowest region; with an exact estimate, nothing.
	t.Logf("overshoot of a limit of %d at %v per ms, lag %dms, flush %dms: %d without the reserve, %d with it", limit, rates, lag, flush, without, with)
	if without < 100 {
		t.Errorf("overshoot without the reserve %d: the simulation does not exercise the lag", without)
	}
	if with > without/10 {
		t.Errorf("overshoot with the reserve %d, want under a tenth of %d", with, without)
	}
}
