package redis

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestExpiryAfter checks that a key written by a request decided ahead of
// Redis' clock (After) lives until its state is restored, counted from
// Redis' clock: the reserved unit is not forgotten early.
func TestExpiryAfter(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, ExpiryMargin: 100 * time.Millisecond})
	for _, a := range sluice.Algorithms {
		// One unit per minute: the first request takes it, the second is
		// reserved for when it is back, a minute from now.
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 1, Window: time.Minute})
		key := "rl:after:" + a.String()
		check(t, s, store.Request{Key: key, Params: p, Cost: 1})
		d := check(t, s, store.Request{Key: key, Params: p, Cost: 1})
		if d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("%s: second request: got %+v, want denied with a retry", a, d)
		}
		after := d.RetryAfter
		if d = check(t, s, store.Request{Key: key, Params: p, Cost: 1, After: after}); !d.Allowed {
			t.Fatalf("%s: request %s ahead: got %+v, want allowed", a, after, d)
		}
		// The state is restored ResetAfter after the reserved instant,
		// itself after from now.
		wantMS := (after+d.ResetAfter)/time.Millisecond + 100
		pttl, err := srv.Do("PTTL", key)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := strconv.ParseInt(pttl, 10, 64)
		if got > int64(wantMS)+1 || got < int64(wantMS)-2000 {
			t.Errorf("%s: PTTL %d ms, want about %d", a, got, wantMS)
		}
	}
}
