package reservetest

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/reservation"
)

// FairPolicy is the policy of the fairness runs: on /fair/*, pools of 4
// tokens shared by three clients of weights 1, 2 and 4; on /aging/*,
// pools of one token with a queue of 8, where client h weighs 1000 times
// any other, so that another's request waits behind h's under weighted
// fairness too, until it is overdue.
const FairPolicy = `version: 1
rules:
  - id: fair
    match: {resource: "/fair/*"}
    limit: 4
    window: 1s
    reservations:
      queue_limit: 16
      quotas:
        - {client: w1, weight: 1}
        - {client: w2, weight: 2}
        - {client: w4, weight: 4}
  - id: aging
    match: {resource: "/aging/*"}
    limit: 1
    window: 1s
    reservations:
      queue_limit: 8
      quotas: [{client: h, weight: 1000}]
`

// FairnessGrants is the length of a fairness run, in grants.
const FairnessGrants = 10_500

// Shares is what a fairness run measured.
type Shares struct {
	// Grants and Tokens are the grants of each client, and the tokens
	// they granted, by name.
	Grants, Tokens map[string]int64
	// Weights are the clients' weights, by name.
	Weights map[string]int64
	// Deviation is the largest relative deviation of a client's
	// weight-normalized throughput (tokens / weight) from their mean:
	// 0.05 is 5%.
	Deviation float64
	// Jain is Jain's fairness index of the weight-normalized
	// throughputs: 1 when they are all equal, 1/n at worst.
	Jain float64
}

// String returns the shares as tokens granted, their ratio, the grants,
// the deviation and Jain's index.
func (s Shares) String() string {
	base := float64(s.Tokens["w1"])
	return fmt.Sprintf("tokens w1 %d, w2 %d, w4 %d = 1 : %.3f : %.3f (want 1 : 2 : 4) in %d, %d, %d grants, largest deviation %.2f%%, Jain's index %.7f",
		s.Tokens["w1"], s.Tokens["w2"], s.Tokens["w4"], float64(s.Tokens["w2"])/base, float64(s.Tokens["w4"])/base,
		s.Grants["w1"], s.Grants["w2"], s.Grants["w4"], 100*s.Deviation, s.Jain)
}

// measure computes Deviation and Jain from Tokens and Weights.
func (s *Shares) measure() {
	var sum, sq float64
	xs := make([]float64, 0, len(s.Tokens))
	for c, n := range s.Tokens {
		x := float64(n) / float64(s.Weights[c])
		xs = append(xs, x)
		sum += x
		sq += x * x
	}
	n := float64(len(xs))
	s.Jain = sum * sum / (n * sq)
	for _, x := range xs {
		s.Deviation = max(s.Deviation, math.Abs(x/(sum/n)-1))
	}
}

// grants is an events.Sink that keeps the grants it receives, in order.
type grants struct {
	mu  sync.Mutex
	got []events.Event
}

func (g *grants) Emit(ev *events.Event) {
	if ev.Type == events.ReservationGranted {
		g.mu.Lock()
		g.got = append(g.got, *ev)
		g.mu.Unlock()
	}
}

// take returns the grants received since the last call.
func (g *grants) take() []events.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := g.got
	g.got = nil
	return out
}

// fairKeeper returns a Keeper on b with FairPolicy, the clock now, the
// aging period aging, and no sweep, and the sink of its grants.
func fairKeeper(t testing.TB, b reserve.Backend, now func() time.Time, aging time.Duration) (*reserve.Keeper, *grants) {
	t.Helper()
	p, err := policy.Parse("fair.yaml", []byte(FairPolicy))
	if err != nil {
		t.Fatal(err)
	}
	g := &grants{}
	k, err := reserve.New(reserve.Config{Policy: func() *policy.Policy { return p }, Now: now, AgingPeriod: aging,
		SweepEvery: -1, Backend: b, Events: events.New(events.Config{Sinks: []events.Sink{g}})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k, g
}

// Fairness runs three backlogged clients of weights 1, 2 and 4 (from
// FairPolicy), whose requests are of sizes[client] tokens each, through
// a Keeper on b for FairnessGrants grants, and returns their shares.
// Each client keeps 4 requests queued; each step, 1 ms after the last,
// releases the oldest reservation granted, which grants from the queue,
// whose clients ask again. Reservations last 20 ms, so that the pool
// forgets the released ones as it goes.
func Fairness(t testing.TB, b reserve.Backend, sizes map[string]int64) Shares {
	t.Helper()
	c := NewClock()
	k, g := fairKeeper(t, b, c.Now, 0)
	sh := Shares{Grants: map[string]int64{}, Tokens: map[string]int64{}, Weights: map[string]int64{"w1": 1, "w2": 2, "w4": 4}}
	// A pool of the run's own, whatever ran on b before.
	resource := fmt.Sprintf("/fair/%d-%d-%d", sizes["w1"], sizes["w2"], sizes["w4"])
	ask := func(client string) {
		t.Helper()
		a := reserve.Ask{Client: client, Resource: resource, Tokens: sizes[client], Duration: 20 * time.Millisecond, Priority: reservation.Normal}
		if _, err := k.Reserve(a); err != nil {
			t.Fatalf("Reserve %s: %v", client, err)
		}
	}
	for range 4 {
		for _, client := range []string{"w1", "w2", "w4"} {
			ask(client)
		}
	}
	var held []events.Event // granted, oldest first
	total := 0
	for {
		// Each grant is counted, and its client asks again, which may
		// be granted in turn.
		for news := g.take(); len(news) > 0; news = g.take() {
			for _, ev := range news {
				held = append(held, ev)
				sh.Grants[ev.ClientID]++
				sh.Tokens[ev.ClientID] += ev.Tokens
				total++
				ask(ev.ClientID)
			}
		}
		if total >= FairnessGrants {
			break
		}
		if len(held) == 0 {
			t.Fatalf("after %d grants, nothing is held and nothing was granted", total)
		}
		c.Add(time.Millisecond)
		if _, err := k.Release(held[0].ClientID, held[0].Reservation); err != nil {
			t.Fatalf("Release of grant %d: %v", total, err)
		}
		held = held[1:]
	}
	sh.measure()
	return sh
}

// AgingWait runs a low-priority request under sustained high-priority
// load through a Keeper on b whose aging period is period, and returns
// how long it waited, and the bound the reservation package documents:
// t + 3P + L·(D+g) + g, with L the queue limit (8), D the longest
// duration held (50 ms) and g the step between transitions (10 ms). The
// pool has one token; client h, of weight 1000, keeps the queue full of
// high-priority requests of one token, each released 10 ms after it is
// granted, so that the low request, of weight 1, is passed over at 2P
// too (its finish tag is behind h's) and granted once overdue, at 3P.
func AgingWait(t testing.TB, b reserve.Backend, period time.Duration) (wait, bound time.Duration) {
	t.Helper()
	const (
		limit = 8
		d     = 50 * time.Millisecond
		step  = 10 * time.Millisecond
	)
	c := NewClock()
	k, g := fairKeeper(t, b, c.Now, period)
	ask := func(client string, p reservation.Priority) reserve.Result {
		t.Helper()
		r, err := k.Reserve(reserve.Ask{Client: client, Resource: "/aging/run", Tokens: 1, Duration: d, Priority: p})
		if err != nil {
			t.Fatalf("Reserve %s: %v", client, err)
		}
		return r
	}
	for range limit {
		ask("h", reservation.High)
	}
	held := g.take()
	low := ask("l", reservation.Low)
	if low.Granted {
		t.Fatalf("the low request was granted at once under load")
	}
	bound = 3*period + limit*(d+step) + step
	start := c.Now()
	for c.Now().Sub(start) <= 2*bound {
		c.Add(step)
		if len(held) > 0 {
			if _, err := k.Release(held[0].ClientID, held[0].Reservation); err != nil && !errors.Is(err, reservation.ErrNotFound) {
				t.Fatalf("Release: %v", err)
			}
			held = held[1:]
		}
		for news := g.take(); len(news) > 0; news = g.take() {
			for _, ev := range news {
				if ev.ClientID == "l" {
					return c.Now().Sub(start), bound
				}
				held = append(held, ev)
				ask("h", reservation.High) // the load goes on
			}
		}
	}
	t.Fatalf("the low request was not granted within %s (twice the bound)", c.Now().Sub(start))
	return 0, bound
}

// reloadPolicy is a pool of 10 tokens on /reload/* with the queue limit
// queue, and client a's max_burst burst.
func reloadPolicy(queue, burst int) string {
	return fmt.Sprintf(`version: 1
rules:
  - id: reload
    match: {resource: "/reload/*"}
    limit: 10
    window: 1s
    reservations:
      queue_limit: %d
      quotas: [{client: a, max_burst: %d}]
`, queue, burst)
}

// testReload: a pool takes its rule's new queue limit and quotas at its
// next reservation after a reload; what is granted stays granted.
func testReload(t *testing.T, b reserve.Backend) {
	parse := func(src string) *policy.Policy {
		p, err := policy.Parse("reload.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	var cur atomic.Pointer[policy.Policy]
	cur.Store(parse(reloadPolicy(1, 10)))
	c := NewClock()
	k, err := reserve.New(reserve.Config{Policy: cur.Load, Now: c.Now, SweepEvery: -1, Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	ask := func(client string, tokens int64) (reserve.Result, error) {
		return k.Reserve(reserve.Ask{Client: client, Resource: "/reload/x", Tokens: tokens, Duration: time.Minute, Priority: reservation.Normal})
	}
	if r, err := ask("a", 10); err != nil || !r.Granted {
		t.Fatalf("a's 10 = %+v, %v; want granted", r, err)
	}
	if r, err := ask("b", 1); err != nil || r.Position != 1 {
		t.Fatalf("b's 1 = %+v, %v; want queued", r, err)
	}
	if _, err := ask("c", 1); !errors.Is(err, reservation.ErrQueueFull) {
		t.Fatalf("c's 1 beyond queue_limit 1: %v, want ErrQueueFull", err)
	}
	cur.Store(parse(reloadPolicy(2, 3)))
	if r, err := ask("c", 1); err != nil || r.Position != 2 {
		t.Errorf("c's 1 after queue_limit 2 = %+v, %v; want queued at 2", r, err)
	}
	var ie *reservation.InvalidError
	if _, err := ask("a", 4); !errors.As(err, &ie) || ie.Field != "tokens" {
		t.Errorf("a's 4 above its new max_burst 3: %v, want invalid tokens", err)
	}
	if held, capacity := k.Held("a", "/reload/x"); held != 10 || capacity != 10 {
		t.Errorf("Held = %d of %d, want 10 of 10: the grant stays", held, capacity)
	}
}
