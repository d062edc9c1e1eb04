package reservation

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// backlog drives a pool in which every client keeps depth requests
// queued: at each step the oldest reservation is released, the queue is
// granted, and each client granted asks again.
type backlog struct {
	t     *testing.T
	c     *Config
	s     State
	now   int64
	held  []int64 // granted IDs, oldest first
	tok   map[string]int64
	prio  map[string]Priority
	asked map[int64]int64 // enqueue instant by ID
	// served counts the grants and tokens of each client; wait records
	// the longest wait of each.
	grants, tokens, wait map[string]int64
}

func newBacklog(t *testing.T, c *Config) *backlog {
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return &backlog{t: t, c: c, now: t0, tok: map[string]int64{}, prio: map[string]Priority{},
		asked: map[int64]int64{}, grants: map[string]int64{}, tokens: map[string]int64{}, wait: map[string]int64{}}
}

func (b *backlog) reserve(client string) {
	b.t.Helper()
	r, fx, err := Reserve(b.c, &b.s, b.now, Ask{Client: client, Tokens: b.tok[client], Duration: b.c.maxDuration(), Priority: b.prio[client]})
	if err != nil {
		b.t.Fatalf("reserve %s: %v", client, err)
	}
	b.asked[r.ID] = b.now
	b.effects(fx)
}

func (b *backlog) effects(fx Effects) {
	for _, g := range fx.Granted {
		b.held = append(b.held, g.ID)
		b.grants[g.Client]++
		b.tokens[g.Client] += g.Tokens
		b.wait[g.Client] = max(b.wait[g.Client], b.now-b.asked[g.ID])
		delete(b.asked, g.ID)
	}
}

// step advances by dt, releases the oldest reservation, and tops the
// backlog of each of the clients up to depth queued requests.
func (b *backlog) step(dt int64, clients []string, depth int64) {
	b.t.Helper()
	b.now += dt
	if len(b.held) > 0 {
		id := b.held[0]
		b.held = b.held[1:]
		_, fx, err := Release(b.c, &b.s, b.now, id)
		if err != nil && !errors.Is(err, ErrNotFound) { // ErrNotFound: expired
			b.t.Fatalf("release %d: %v", id, err)
		}
		b.effects(fx)
	} else {
		b.effects(Expire(b.c, &b.s, b.now))
	}
	for _, n := range clients {
		for b.s.Clients[n].Queued < depth {
			b.reserve(n)
		}
	}
}

// jain returns Jain's fairness index of xs: 1 when all are equal, 1/n
// when one has everything.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// TestWeightedFairness keeps three clients of weights 1, 2 and 4
// backlogged and checks that their grants over 12,000 grants are within
// 5% of 1:2:4, with Jain's index of the weight-normalised throughput.
func TestWeightedFairness(t *testing.T) {
	for _, sizes := range [][3]int64{{2, 2, 2}, {1, 3, 2}} {
		t.Run(fmt.Sprintf("tokens %v", sizes), func(t *testing.T) {
			names := []string{"w1", "w2", "w4"}
			weights := []int64{1, 2, 4}
			c := &Config{Capacity: 10, QueueLimit: 64, AgingPeriod: 3600 * sec, MaxDuration: sec,
				Quotas: map[string]Quota{}}
			for i, n := range names {
				c.Quotas[n] = Quota{Weight: weights[i]}
			}
			b := newBacklog(t, c)
			for i, n := range names {
				b.tok[n] = sizes[i]
				b.prio[n] = Normal
			}
			// Warm up, then count from a clean slate.
			for range 1000 {
				b.step(sec/1000, names, 8)
			}
			clear(b.grants)
			clear(b.tokens)
			total := int64(0)
			for total < 12_000 {
				b.step(sec/1000, names, 8)
				total = b.grants["w1"] + b.grants["w2"] + b.grants["w4"]
			}
			// Tokens are what the weights share; with equal sizes they
			// are the grants.
			norm := make([]float64, 3)
			for i, n := range names {
				norm[i] = float64(b.tokens[n]) / float64(weights[i])
			}
			mean := (norm[0] + norm[1] + norm[2]) / 3
			for i, n := range names {
				if dev := math.Abs(norm[i]/mean - 1); dev > 0.05 {
					t.Errorf("%s: %d tokens, %.1f per unit of weight, %.1f%% from the mean", n, b.tokens[n], norm[i], 100*dev)
				}
			}
			if sizes[0] == sizes[1] && sizes[1] == sizes[2] {
				// Equal requests: the grants themselves are in 1:2:4.
				for i, n := range names {
					want := float64(total) * float64(weights[i]) / 7
					if dev := math.Abs(float64(b.grants[n])/want - 1); dev > 0.05 {
						t.Errorf("%s: %d grants, want %.0f within 5%%", n, b.grants[n], want)
					}
				}
			}
			j := jain(norm)
			if j < 0.999 {
				t.Errorf("Jain's index %.5f, want at least 0.999", j)
			}
			t.Logf("grants %d:%d:%d (%d), tokens %d:%d:%d, ratio 1:%.3f:%.3f, Jain's index %.6f",
				b.grants["w1"], b.grants["w2"], b.grants["w4"], total,
				b.tokens["w1"], b.tokens["w2"], b.tokens["w4"],
				float64(b.tokens["w2"])/float64(b.tokens["w1"]), float64(b.tokens["w4"])/float64(b.tokens["w1"]), j)
		})
	}
}

// TestStarvation keeps high-priority clients backlogged, enough to take
// the whole pool forever, and checks that a low-priority request is
// granted within the documented bound t + 3P + L·D, and, with aging made
// too slow to matter, that the same load would starve it.
func TestStarvation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		aging int64
	}{
		{"aging", 2 * sec},
		{"no aging within the run", 1_000_000 * sec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{Capacity: 10, QueueLimit: 16, AgingPeriod: tc.aging, MaxDuration: 5 * sec,
				Quotas: map[string]Quota{"h1": {Weight: 16}, "h2": {Weight: 16}, "h3": {Weight: 16}, "low": {Weight: 1}}}
			b := newBacklog(t, c)
			high := []string{"h1", "h2", "h3"}
			for _, n := range high {
				b.tok[n], b.prio[n] = 5, High
			}
			b.tok["low"], b.prio["low"] = 10, Low
			for range 100 {
				b.step(sec/10, high, 4)
			}
			asked := b.now
			b.reserve("low")
			bound := 3*c.AgingPeriod + c.QueueLimit*c.maxDuration()
			for b.grants["low"] == 0 && b.now-asked <= 3600*sec {
				b.step(sec/10, high, 4)
			}
			highGrants := b.grants["h1"] + b.grants["h2"] + b.grants["h3"]
			if tc.aging > 3600*sec {
				if b.grants["low"] != 0 {
					t.Fatalf("the low request was granted without aging: the load does not starve it")
				}
				t.Logf("without aging: not granted in an hour, %d high grants", highGrants)
				return
			}
			waited := b.wait["low"]
			if b.grants["low"] == 0 || waited > bound {
				t.Fatalf("low request waited %v (granted %d), bound %v", us(b.now-asked), b.grants["low"], us(bound))
			}
			t.Logf("low request granted after %v, bound 3P + L·D = %v (P %v, L %d, D %v), %d high grants meanwhile",
				us(waited), us(bound), us(c.AgingPeriod), c.QueueLimit, us(c.maxDuration()), highGrants)
		})
	}
}

func us(n int64) string { return fmt.Sprintf("%.1fs", float64(n)/float64(sec)) }
