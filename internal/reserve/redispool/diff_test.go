package redispool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/reservation"
)

// diffPool is the pool of the differential test: small, with weights,
// a guarantee, a burst and a short aging period, so that random
// operations reach every branch of the order and of the grants.
var diffPool = reserve.Pool{
	Handle: reserve.PoolHandle("diff", "/diff"), Rule: "diff", Resource: "/diff",
	Config: reservation.Config{
		Capacity: 20, QueueLimit: 8, AgingPeriod: 3_000_000,
		Default: reservation.Quota{Weight: 1},
		Quotas: map[string]reservation.Quota{
			"a": {Weight: 1},
			"b": {Weight: 2, MinGuaranteed: 4},
			"c": {Weight: 4, MaxBurst: 12},
		},
	},
}

// bigPool is the differential test's pool of the largest capacity, whose
// requests of millions of tokens push the virtual time past the point
// where every tag is shifted down (reservation's rebase) every few grants.
var bigPool = reserve.Pool{
	Handle: reserve.PoolHandle("big", "/big"), Rule: "big", Resource: "/big",
	Config: reservation.Config{
		Capacity: reservation.MaxCapacity, QueueLimit: 8, AgingPeriod: 3_000_000,
		Quotas: map[string]reservation.Quota{"b": {Weight: 3}, "c": {Weight: 1, MinGuaranteed: 1 << 22}},
	},
}

// TestDifferential runs random sequences of operations on the memory
// backend, which runs the pure transitions of package reservation, and on
// the Redis scripts, at the same instants, and compares every result,
// error and effect, and the tokens held after each operation.
func TestDifferential(t *testing.T) {
	steps := 1500
	if testing.Short() {
		steps = 300
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			c := newClient(t, s.addrs())
			for seed := range uint64(3) {
				t.Run(fmt.Sprint(seed), func(t *testing.T) {
					differential(t, reserve.NewMemory(0), newPools(t, c), &diffPool, seed, steps)
				})
			}
			t.Run("big", func(t *testing.T) {
				differential(t, reserve.NewMemory(0), newPools(t, c), &bigPool, 9, steps)
			})
		})
	}
}

// outcome is one operation's result on one backend, normalized for
// comparison.
type outcome struct {
	Result any
	Err    string
	FX     []reserve.Effect
}

func differential(t *testing.T, mem, rds reserve.Backend, pool *reserve.Pool, seed uint64, steps int) {
	unit := pool.Config.Capacity / 20 // tokens asked for are 1 to 14 units
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(seed, 42))
	now := int64(1_800_000_000_000_000)
	var secrets []string
	clients := []string{"a", "b", "c", "d"}
	pick := func() string {
		if len(secrets) == 0 || rnd.IntN(10) == 0 {
			return "unknown"
		}
		// Mostly recent ones, which are more often queued or granted.
		return secrets[max(0, len(secrets)-1-rnd.IntN(12))]
	}
	seen := map[string]int{}
	for step := range steps {
		now += rnd.Int64N(1_500_000)
		var op string
		var run func(b reserve.Backend) outcome
		switch r := rnd.IntN(100); {
		case r < 35:
			secret := fmt.Sprintf("s%05d", step)
			secrets = append(secrets, secret)
			a := reservation.Ask{Client: clients[rnd.IntN(len(clients))], Tokens: 1 + rnd.Int64N(14*unit),
				Duration: 1 + rnd.Int64N(20_000_000), Priority: reservation.Priority(1 + rnd.IntN(3))}
			switch rnd.IntN(30) {
			case 0:
				a.Tokens = pool.Config.Capacity + 1
			case 1:
				a.Priority = 0
			case 2:
				a.Duration = 301_000_000
			}
			op = fmt.Sprintf("Reserve(%+v, %s)", a, secret)
			run = func(b reserve.Backend) outcome {
				p := *pool
				res, fx, err := b.Reserve(ctx, &p, now, a, secret)
				res.ID = 0 // internal to each backend
				return outcome{res, errText(err), fx}
			}
		case r < 50:
			secret, client := pick(), ""
			if rnd.IntN(5) == 0 {
				client = clients[rnd.IntN(len(clients))]
			}
			op = fmt.Sprintf("Get(%s, %q)", secret, client)
			run = func(b reserve.Backend) outcome {
				rec, fx, err := b.Get(ctx, pool.Handle, secret, client, now)
				return outcome{rec, errText(err), fx}
			}
		case r < 72:
			secret, n := pick(), rnd.Int64N(8*unit)-1
			op = fmt.Sprintf("Use(%s, %d)", secret, n)
			run = func(b reserve.Backend) outcome {
				rec, fx, err := b.Use(ctx, pool.Handle, secret, "", now, n)
				return outcome{rec, errText(err), fx}
			}
		case r < 90:
			secret := pick()
			op = fmt.Sprintf("Release(%s)", secret)
			run = func(b reserve.Backend) outcome {
				end, fx, err := b.Release(ctx, pool.Handle, secret, "", now)
				return outcome{end, errText(err), fx}
			}
		case r < 95:
			client := clients[rnd.IntN(len(clients))]
			op = fmt.Sprintf("Peek(%s)", client)
			run = func(b reserve.Backend) outcome {
				pk, err := b.Peek(ctx, pool.Handle, client, now)
				if pk.Position == 0 { // the Redis backend may answer without a round trip
					pk = reserve.Peeked{}
				}
				pk.Held, pk.Capacity = 0, 0
				return outcome{pk, errText(err), nil}
			}
		default:
			op = "Sweep"
			run = func(b reserve.Backend) outcome {
				fx, err := b.Sweep(ctx, now)
				return outcome{nil, errText(err), fx}
			}
		}
		want, got := normalize(run(mem)), normalize(run(rds))
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d at +%s: %s\nmemory: %+v\nredis:  %+v", step,
				time.Duration(now-1_800_000_000_000_000)*time.Microsecond, op, want, got)
		}
		seen[cmp.Or(want.Err, "ok")]++
		for _, e := range want.FX {
			seen[string(e.Type)]++
		}
		if r, ok := want.Result.(reservation.Result); ok && want.Err == "" && !r.Granted {
			seen["queued"]++
		}
		mh, err1 := mem.Peek(ctx, pool.Handle, "", now)
		rh, err2 := rds.Peek(ctx, pool.Handle, "", now)
		if err1 != nil || err2 != nil || mh.Held != rh.Held || mh.Held > pool.Config.Capacity {
			t.Fatalf("step %d: %s: held %d in memory, %d in Redis (%v, %v)", step, op, mh.Held, rh.Held, err1, err2)
		}
	}
	t.Logf("outcomes: %v", seen)
}

// errText is an error as compared: its sentinel, or the field and reason
// of an *reservation.InvalidError.
func errText(err error) string {
	if err == nil {
		return ""
	}
	var ie *reservation.InvalidError
	if errors.As(err, &ie) {
		return "invalid " + ie.Field + ": " + ie.Reason
	}
	for _, s := range []error{reservation.ErrQueueFull, reservation.ErrNotFound, reservation.ErrInsufficient,
		reservation.ErrNotQueued, reservation.ErrNotGranted, reserve.ErrForbidden} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "unexpected: " + err.Error()
}

// normalize orders each run of expiries by secret: both backends expire
// the same reservations at an instant, but list them in different orders
// (the memory in the order of their grants, Redis by expiry instant).
func normalize(o outcome) outcome {
	fx := o.FX
	for i := 0; i < len(fx); {
		j := i
		for j < len(fx) && fx[j].Type == events.ReservationExpired {
			j++
		}
		slices.SortFunc(fx[i:j], func(a, b reserve.Effect) int { return cmp.Compare(a.Secret, b.Secret) })
		i = j + 1
	}
	if len(fx) == 0 {
		o.FX = nil
	}
	return o
}
