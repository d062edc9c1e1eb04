package redis

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// keyNow is a script that answers, in one atomic step, a key's value
// (hex), its time to live in ms and Redis' clock in µs.
const keyNow = `local v = redis.call('GET', KEYS[1]) or ''
local t = redis.call('TIME')
return string.format('%s %d %s%06d', (v:gsub('.', function(c) return string.format('%02x', c:byte()) end)),
  redis.call('PTTL', KEYS[1]), t[1], tonumber(t[2]))`

// bucketKey is what keyNow found under a key of a bucket or GCRA.
type bucketKey struct {
	tag      byte
	st       algorithm.State
	expiry   float64 // the key's expiry the state records (µs), layout 3
	pttl     int64   // ms
	clock    int64   // Redis' clock, µs
	hasState bool
}

func readBucketKey(t *testing.T, srv *redistest.Server, key string) bucketKey {
	t.Helper()
	out, err := srv.Do("EVAL", keyNow, "1", key)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(out)
	var k bucketKey
	if len(f) == 2 {
		f = append([]string{""}, f...)
	}
	if len(f) != 3 {
		t.Fatalf("%s: %q", key, out)
	}
	k.pttl, _ = strconv.ParseInt(f[1], 10, 64)
	k.clock, _ = strconv.ParseInt(f[2], 10, 64)
	if f[0] == "" {
		return k
	}
	var v []byte
	for i := 0; i+1 < len(f[0]); i += 2 {
		b, _ := strconv.ParseUint(f[0][i:i+2], 16, 8)
		v = append(v, byte(b))
	}
	if len(v) != 25 {
		t.Fatalf("%s holds %d bytes, want 25", key, len(v))
	}
	d := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v[1+8*i:])) }
	k.tag, k.hasState = v[0], true
	k.st = algorithm.State{A: int64(d(0)), B: int64(d(1))}
	k.expiry = d(2)
	return k
}

// TestBucketsWriteInPlace checks the common check of the buckets and
// GCRA at Redis' clock, which records in the state the expiry it set on
// the key and, while that expiry covers the new state and the margin,
// writes the state in place (the time to live kept), and otherwise sets
// more than the state needs (twice, or what it needs and a window more):
// after every admitted check the key lives at least until its state is
// restored (algorithm.ExpiresAt) plus the margin, so that a key never
// expires while its state still matters, and no longer than that bound;
// and both kinds of write happen.
func TestBucketsWriteInPlace(t *testing.T) {
	srv := redistest.Start(t)
	const margin = 40 * time.Millisecond
	s := newStore(t, Config{Addrs: []string{srv.Addr}, ExpiryMargin: margin})
	shared := []algorithm.Params{
		*compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 30, Window: time.Second}),
		*compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 20, Window: time.Second}),
	}
	algorithm.ShareState(shared)
	cases := []struct {
		name string
		p    *algorithm.Params
	}{
		{"gcra", compile(t, sluice.Limit{Algorithm: sluice.GCRA, Limit: 20, Window: time.Second})},
		{"token", compile(t, sluice.Limit{Algorithm: sluice.TokenBucket, Limit: 20, Window: time.Second})},
		{"leaky", compile(t, sluice.Limit{Algorithm: sluice.LeakyBucket, Limit: 20, Window: time.Second})},
		// the faster of two priorities sharing a key: its expiry is
		// counted at the slower refill
		{"token-shared", &shared[0]},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range cases {
		key := "rl:inplace:" + tc.name
		var inPlace, moved int
		prev := readBucketKey(t, srv, key)
		for i := range 60 {
			d := check(t, s, store.Request{Key: key, Params: tc.p, Cost: 1 + int64(i%3)})
			k := readBucketKey(t, srv, key)
			if d.Allowed {
				if !k.hasState || k.tag != 3 {
					t.Fatalf("%s check %d: the key holds %+v, want the layout with its expiry", tc.name, i, k)
				}
				// The key's expiry, less 1 ms for PTTL's rounding.
				expires := k.clock + (k.pttl-1)*1000
				if need := algorithm.ExpiresAt(tc.p, k.st) + margin.Microseconds(); expires < need {
					t.Fatalf("%s check %d: the key expires %d µs before its state is restored plus the margin (%+v)", tc.name, i, need-expires, k)
				}
				// Redis counts a time to live from the start of the
				// script, the record from the script's read of the clock:
				// they differ by the time between the two (within the
				// margin, as for any key written with a time to live).
				if rec := int64(k.expiry); rec > k.clock+k.pttl*1000+margin.Microseconds()/2 {
					t.Fatalf("%s check %d: the state records an expiry %d µs after the key's", tc.name, i, rec-k.clock-k.pttl*1000)
				}
				switch {
				case prev.hasState && prev.tag == 3 && k.expiry == prev.expiry:
					inPlace++
					if k.pttl > prev.pttl {
						t.Errorf("%s check %d: written in place, but its time to live grew from %d to %d ms", tc.name, i, prev.pttl, k.pttl)
					}
				default:
					moved++
					// and no longer than twice what it needs, or, for a
					// key found alive, what it needs and a window more
					// (what it needs counted at the read, less than at
					// the write by the time between them: 10 ms allowed)
					need := (algorithm.ExpiresAt(tc.p, k.st)+margin.Microseconds()-k.clock)/1000 + 10
					if most := need + max(need, tc.p.WindowDuration().Milliseconds()); k.pttl > most {
						t.Errorf("%s check %d: a time to live of %d ms, want at most %d", tc.name, i, k.pttl, most)
					}
				}
			} else if k.st != prev.st || k.expiry != prev.expiry || k.pttl > prev.pttl {
				t.Errorf("%s check %d: a refusal changed the key from %+v to %+v", tc.name, i, prev, k)
			}
			prev = k
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			if !d.Allowed {
				time.Sleep(d.RetryAfter)
			}
		}
		if inPlace == 0 || moved < 2 {
			t.Errorf("%s: %d writes in place and %d setting the expiry; want both", tc.name, inPlace, moved)
		}
		t.Logf("%s: %d writes in place, %d setting the expiry", tc.name, inPlace, moved)
	}
}

// TestBucketLayouts checks that a bucket's or GCRA's state is read
// whichever path wrote it: the common check (the layout with the key's
// expiry, byte 3), and the general paths of both scripts (the 25 bytes of
// earlier versions, byte 2), so that a key keeps its debt from one to the
// other and, across an upgrade, from the earlier layout.
func TestBucketLayouts(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	ctx := t.Context()
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		p := compile(t, sluice.Limit{Algorithm: a, Limit: 10, Window: time.Hour})
		key := "rl:layouts:" + a.String()
		steps := []struct {
			via string
			tag byte
		}{
			{"instant", 2}, {"common", 3}, {"CheckAll", 2}, {"common", 3}, {"mixed", 2}, {"common", 3}, {"common", 3},
		}
		for i, st := range steps {
			r := store.Request{Key: key, Params: p, Cost: 1}
			var d sluice.Decision
			switch st.via {
			case "instant":
				r.Now = time.Now()
				d = check(t, s, r)
			case "common":
				d = check(t, s, r)
			case "CheckAll":
				d = checkVia(t, s, "CheckAll", []store.Request{r})[0]
			case "mixed":
				// two costs: each check carries its own
				other := store.Request{Key: key + ":other", Params: p, Cost: 2}
				out := make([]sluice.Decision, 2)
				if err := s.Check(ctx, []store.Request{r, other}, out); err != nil {
					t.Fatal(err)
				}
				d = out[0]
			}
			if want := int64(9 - i); !d.Allowed || d.Remaining != want {
				t.Errorf("%s step %d (%s): %+v, want allowed with %d remaining", a, i, st.via, d, want)
			}
			if k := readBucketKey(t, srv, key); k.tag != st.tag {
				t.Errorf("%s step %d (%s): layout %d, want %d", a, i, st.via, k.tag, st.tag)
			}
		}
	}
	if n := s.CorruptResets(); n != 0 {
		t.Errorf("%d corrupt resets, want 0", n)
	}
}
