package redispool

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/internal/reserve/reservetest"
	"github.com/sluicehq/sluice/reservation"
)

// TestTwoInstances runs two Keepers, each with its own connection to one
// Redis (two instances of Sluice), at the Redis server's clock, with
// 1,000 reservations racing for a pool of 100 tokens: half released once
// drawn from, half left to expire. A sampler reads the pool's held tokens
// (atomically, in a script) all along: never above 100. At the end every
// token is back, and the events of both instances account for each one
// once: what was granted was returned by a release or an expiry.
func TestTwoInstances(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) { twoInstances(t, s.addrs()) })
	}
}

func twoInstances(t *testing.T, addrs []string) {
	const n = 1000
	pol, err := policy.Parse("test.yaml", []byte(reservetest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	var keepers [2]*reserve.Keeper
	var sinks [2]*reservetest.Sink
	var pools [2]*Pools
	prefix := testPrefix(t)
	for i := range keepers {
		p, err := New(Config{Client: newClient(t, addrs), Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		sinks[i] = &reservetest.Sink{}
		k, err := reserve.New(reserve.Config{Policy: func() *policy.Policy { return pol }, Backend: p,
			QueueLimit: n, SweepEvery: 50 * time.Millisecond, Timeout: 10 * time.Second,
			Events: events.New(events.Config{Sinks: []events.Sink{sinks[i]}})})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.Close() })
		keepers[i], pools[i] = k, p
	}
	handle := reserve.PoolHandle("api", "/api/orders")

	// The sampler.
	var maxHeld, samples atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan error, 1)
	go func() {
		var err error
		defer func() { sampled <- err }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var pk reserve.Peeked
			pk, err = pools[0].Peek(context.Background(), handle, "", 0)
			if err != nil {
				return
			}
			samples.Add(1)
			if pk.Held > maxHeld.Load() {
				maxHeld.Store(pk.Held)
			}
			time.Sleep(time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	var failures, lapsed atomic.Int64
	for i := range n {
		wg.Go(func() {
			k := keepers[i%2]
			client := []string{"a", "b", "c", "d"}[i%4]
			rnd := rand.New(rand.NewPCG(uint64(i), 7))
			res, err := k.Reserve(reservetest.Ask(client, 1+rnd.Int64N(3), 300*time.Millisecond))
			if err != nil {
				t.Errorf("Reserve %d: %v", i, err)
				failures.Add(1)
				return
			}
			// Wait for the grant, asking either instance.
			for !res.Granted {
				time.Sleep(time.Duration(20+rnd.IntN(60)) * time.Millisecond)
				st, err := keepers[rnd.IntN(2)].Get(client, res.ID)
				if errors.Is(err, reservation.ErrNotFound) {
					lapsed.Add(1) // granted and expired between two looks
					return
				}
				if err != nil {
					t.Errorf("Get %d: %v", i, err)
					failures.Add(1)
					return
				}
				res.Granted = st.State == "granted"
			}
			if _, err := keepers[rnd.IntN(2)].Use(&policy.Request{ClientID: client}, res.ID, 1); err != nil &&
				!errors.Is(err, reservation.ErrNotFound) { // expired meanwhile
				t.Errorf("Use %d: %v", i, err)
			}
			if i%2 == 0 {
				if _, err := keepers[rnd.IntN(2)].Release(client, res.ID); err != nil && !errors.Is(err, reservation.ErrNotFound) {
					t.Errorf("Release %d: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	// Everything left expires within 300ms; the sweeps report it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		pk, err := pools[1].Peek(context.Background(), handle, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if pk.Held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tokens still held 10s after the last reservation", pk.Held)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	for _, k := range keepers {
		k.Close() // waits for a sweep under way to report its events
	}
	if err := <-sampled; err != nil {
		t.Fatal(err)
	}
	if failures.Load() > 0 {
		t.FailNow()
	}
	if m := maxHeld.Load(); m > 100 || m == 0 {
		t.Errorf("at most %d tokens held at once over %d samples, want at most 100 (and some)", m, samples.Load())
	}
	var grants, granted, returned int64
	for _, s := range sinks {
		g, gt := s.Tokens(events.ReservationGranted)
		_, rt := s.Tokens(events.ReservationReleased)
		_, et := s.Tokens(events.ReservationExpired)
		grants += int64(g)
		granted += gt
		returned += rt + et
	}
	if grants != n || granted != returned {
		t.Errorf("events: %d grants of %d tokens, %d tokens returned; want %d grants, every token returned once",
			grants, granted, returned, n)
	}
	t.Logf("%d reservations (%d expired before their holder looked), at most %d tokens held at once over %d samples",
		n, lapsed.Load(), maxHeld.Load(), samples.Load())
}

// TestInstanceDies reserves through one instance, which then stops for
// good, and finds the reservation expired, its tokens back and the expiry
// reported, by another instance that never served that pool: its sweep
// finds the pool in the registry.
func TestInstanceDies(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			pol, err := policy.Parse("test.yaml", []byte(reservetest.Policy))
			if err != nil {
				t.Fatal(err)
			}
			prefix := testPrefix(t)
			newKeeper := func(sweep time.Duration) (*reserve.Keeper, *reservetest.Sink) {
				p, err := New(Config{Client: newClient(t, s.addrs()), Prefix: prefix})
				if err != nil {
					t.Fatal(err)
				}
				sink := &reservetest.Sink{}
				k, err := reserve.New(reserve.Config{Policy: func() *policy.Policy { return pol }, Backend: p,
					SweepEvery: sweep, Events: events.New(events.Config{Sinks: []events.Sink{sink}})})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { k.Close() })
				return k, sink
			}
			dying, _ := newKeeper(-1)
			res, err := dying.Reserve(reservetest.Ask("a", 70, time.Second))
			if err != nil || !res.Granted {
				t.Fatalf("Reserve = %+v, %v", res, err)
			}
			if _, err := dying.Use(&policy.Request{ClientID: "a"}, res.ID, 20); err != nil {
				t.Fatal(err)
			}
			dying.Close() // and never called again
			_, sink := newKeeper(50 * time.Millisecond)
			deadline := time.Now().Add(10 * time.Second)
			for {
				if n, tokens := sink.Tokens(events.ReservationExpired); n == 1 {
					if tokens != 70 {
						t.Errorf("the expiry returned %d tokens, want 70", tokens)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the other instance reported no expiry within 10 s")
				}
				time.Sleep(20 * time.Millisecond)
			}
			other, _ := newKeeper(-1)
			if held, _ := other.Held("a", "/api/orders"); held != 0 {
				t.Errorf("held after the expiry: %d, want 0", held)
			}
		})
	}
}
