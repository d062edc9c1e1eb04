package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// checkeach.lua's arguments and reply. Its parameters and checks travel
// in one binary argument, and its reply is one string of doubles, one per
// admitted check of the buckets' and GCRA's common call: Redis makes a
// string of every argument and converts every element of a reply at a
// cost that, per check, is about that of its GET, and Lua's tonumber is
// strtod.

// Sizes in the binary argument of checkeach.lua: its head is a double, 2
// uint16, a byte and a double, a parameter set 7 doubles, a check a uint16
// and 2 doubles.
const (
	eachHeadSize  = 8 + 2 + 2 + 1 + 8
	eachSetSize   = 7 * 8
	eachCheckSize = 2 + 2*8
)

// errEachReply reports a checkeach.lua reply of the wrong shape.
var errEachReply = errors.New("malformed reply of the check script")

// The call modes of checkeach.lua (the byte "all" of its argument): each
// check on its own, all or nothing (the keys distinct), and each on its
// own with the keys distinct, which it reads with one MGET.
const (
	eachEach     = 0
	eachAll      = 1
	eachDistinct = 2
)

// eachArgs sets g.args to the argument of a checkeach.lua call on the
// requests g.idx of reqs (keys g.keys) in mode: the expiry margin, the
// parameter sets the requests use (each once), and a set, a cost and an
// instant per request, unless all share one set and cost at Redis' clock;
// then it sets g.uniform to that set. Mode eachEach becomes eachDistinct
// when no key appears twice.
func (s *Store) eachArgs(g *group, reqs []store.Request, mode byte) {
	idx := g.idx
	if mode == eachEach && distinct(g.keys) {
		mode = eachDistinct
	}
	var (
		sets  []*algorithm.Params
		which = make([]int, len(idx))
		index map[algorithm.Params]int // past 8 sets
	)
	for j, i := range idx {
		p := reqs[i].Params
		n := -1
		if index != nil {
			if k, ok := index[*p]; ok {
				n = k
			}
		} else {
			for k, q := range sets {
				if q == p || *q == *p {
					n = k
					break
				}
			}
		}
		if n < 0 {
			n = len(sets)
			sets = append(sets, p)
			if index != nil {
				index[*p] = n
			} else if len(sets) > 8 {
				index = make(map[algorithm.Params]int, 2*len(sets))
				for k, q := range sets {
					index[*q] = k
				}
			}
		}
		which[j] = n + 1
	}
	uniform := len(sets) == 1
	for _, i := range idx {
		r := &reqs[i]
		if !r.Now.IsZero() || r.After > 0 || r.Cost != reqs[idx[0]].Cost {
			uniform = false
			break
		}
	}
	size := eachHeadSize + eachSetSize*len(sets)
	if !uniform {
		size += eachCheckSize * len(idx)
	}
	b := make([]byte, 0, size)
	g.uniform = nil
	if uniform {
		b = s.appendEachHead(b, 1, 1, mode, reqs[idx[0]].Cost)
		g.uniform = sets[0]
	} else {
		b = s.appendEachHead(b, len(sets), 0, mode, 0)
	}
	for _, p := range sets {
		b = appendEachSet(b, p)
	}
	if !uniform {
		for j, i := range idx {
			b = appendEachCheck(b, which[j], &reqs[i])
		}
	}
	g.args = []string{string(b)}
}

// distinct reports whether no key appears twice in keys.
func distinct(keys []string) bool {
	if len(keys) > 16 {
		seen := make(map[string]struct{}, len(keys))
		for _, k := range keys {
			if _, ok := seen[k]; ok {
				return false
			}
			seen[k] = struct{}{}
		}
		return true
	}
	for i, k := range keys {
		if slices.Contains(keys[:i], k) {
			return false
		}
	}
	return true
}

// appendEachHead appends the head of checkeach.lua's argument: the expiry
// margin, the number of parameter sets, when every check uses set uniform
// (not 0) at cost and Redis' clock, that set, the call's mode (eachEach,
// eachAll or eachDistinct), and the cost.
func (s *Store) appendEachHead(b []byte, sets, uniform int, mode byte, cost int64) []byte {
	b = appendDouble(b, s.margin)
	b = binary.LittleEndian.AppendUint16(b, uint16(sets))
	b = binary.LittleEndian.AppendUint16(b, uint16(uniform))
	b = append(b, mode)
	return appendDouble(b, cost)
}

// appendEachSet appends the 7 doubles of a parameter set of checkeach.lua.
func appendEachSet(b []byte, p *algorithm.Params) []byte {
	// deny: 1 deny all, 2 a fixed window counting refused requests;
	// expiry 0: the limit
	var deny, expiry int64
	switch {
	case p.DenyAll:
		deny = 1
	case p.CountRefused && p.Algorithm == sluice.FixedWindow:
		deny = 2
	}
	if p.ExpiryLimit > 0 && p.ExpiryLimit < p.Limit {
		expiry = p.ExpiryLimit
	}
	for _, v := range [...]int64{int64(p.Algorithm), p.Limit, p.Burst, p.Window, p.Quantum, deny, expiry} {
		b = appendDouble(b, v)
	}
	return b
}

// appendEachCheck appends the checkeach.lua check of r, which uses
// parameter set n: the set, the cost and the instant (µs since the epoch,
// or -1 for Redis' clock).
func appendEachCheck(b []byte, n int, r *store.Request) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(n))
	return appendDouble(appendDouble(b, r.Cost), instantMicros(r))
}

// instantMicros is the scripts' instant of r: r.Now + r.After in µs since
// the epoch, or, when r.Now is zero, -1 - r.After in µs, which the scripts
// read as Redis' clock plus r.After (keys then expire by Redis' clock).
func instantMicros(r *store.Request) int64 {
	after := max(r.After, 0).Microseconds()
	if r.Now.IsZero() {
		return -1 - after
	}
	return r.Now.UnixMicro() + after
}

// appendDouble appends v as a little-endian double. Every value the
// scripts take is an integer within 2^53 (costs and limits within
// algorithm.MaxExact, instants in µs), which a double holds exactly.
func appendDouble(b []byte, v int64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(v)))
}

// eachValues returns the values of a checkeach.lua reply, a string of
// little-endian doubles, each an integer.
func eachValues(b []byte) ([]int64, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("%w: %d bytes", errEachReply, len(b))
	}
	vals := make([]int64, len(b)/8)
	for i := range vals {
		vals[i] = int64(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
	}
	return vals, nil
}

// eachReply converts the values of a checkeach.lua reply for n checks into
// check.lua's layout: the corrupt keys reset, 0, then 5 values per check
// (allowed, reason, remaining, reset after, retry after). uniform is the
// parameter set of a call whose checks all use one (nil otherwise): a
// check of its buckets' and GCRA's common call answers one negative
// value, -1 - the debt after it, of which the remaining and reset after
// are computed here, as bucketDecide computes them.
func eachReply(vals []int64, n int, uniform *algorithm.Params) ([]int64, error) {
	out := make([]int64, 2, 2+5*n)
	if len(vals) < 1+n {
		return nil, fmt.Errorf("%w: %d values for %d checks", errEachReply, len(vals), n)
	}
	out[0] = vals[0]
	k := 1
	for range n {
		if k >= len(vals) {
			return nil, fmt.Errorf("%w: %d values for %d checks", errEachReply, len(vals), n)
		}
		code := vals[k]
		k++
		if code < 0 {
			p := uniform
			if p == nil || p.Window <= 0 || p.Limit <= 0 {
				return nil, fmt.Errorf("%w: a debt for a check of no common call", errEachReply)
			}
			debt := -1 - code
			out = append(out, 1, 0, max(p.Burst*p.Window-debt, 0)/p.Window, (debt+p.Limit-1)/p.Limit, 0)
			continue
		}
		if k >= len(vals) {
			return nil, fmt.Errorf("%w: %d values for %d checks", errEachReply, len(vals), n)
		}
		reset := vals[k]
		k++
		reason, rem := code&3, code>>2
		var allowed, retry int64 = 1, 0
		if reason != 0 {
			if k >= len(vals) {
				return nil, fmt.Errorf("%w: %d values for %d checks", errEachReply, len(vals), n)
			}
			allowed, retry = 0, vals[k]
			k++
		}
		out = append(out, allowed, reason, rem, reset, retry)
	}
	if k != len(vals) {
		return nil, fmt.Errorf("%w: %d values for %d checks", errEachReply, len(vals), n)
	}
	return out, nil
}

// checkOne decides a single request of every algorithm but the sliding
// window log with checkeach.lua: the path of most checks, kept free of the
// batch bookkeeping.
func (s *Store) checkOne(ctx context.Context, r *store.Request, out *sluice.Decision) error {
	c := s.client
	key := redisKey(s.prefix, r.Key, s.maxKey)
	var buf [eachHeadSize + eachSetSize + eachCheckSize]byte
	var b []byte
	var uniform *algorithm.Params
	if r.Now.IsZero() && r.After <= 0 {
		b = appendEachSet(s.appendEachHead(buf[:0], 1, 1, eachDistinct, r.Cost), r.Params)
		uniform = r.Params
	} else {
		b = appendEachCheck(appendEachSet(s.appendEachHead(buf[:0], 1, 0, eachDistinct, 0), r.Params), 1, r)
	}
	arg := string(b)
	res := c.Do(ctx, c.B().Evalsha().Sha1(checkEachScript.sha).Numkeys(1).Key(key).Arg(arg).Build())
	if e, ok := rueidis.IsRedisErr(res.Error()); ok && e.IsNoScript() {
		res = c.Do(ctx, c.B().Eval().Script(checkEachScript.src).Numkeys(1).Key(key).Arg(arg).Build())
	}
	raw, err := res.AsBytes()
	if err != nil {
		return s.unavailable(err)
	}
	if len(raw) > 4*8 {
		return fmt.Errorf("redis: %w: %w: %d bytes for 1 check", sluice.ErrStoreUnavailable, errEachReply, len(raw))
	}
	var v [4]int64
	n := len(raw) / 8
	for i := range n {
		v[i] = int64(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
	}
	if len(raw)%8 != 0 {
		return fmt.Errorf("redis: %w: %w: %d bytes for 1 check", sluice.ErrStoreUnavailable, errEachReply, len(raw))
	}
	vals, err := eachReply(v[:n], 1, uniform)
	if err != nil {
		return s.unavailable(err)
	}
	if vals[0] > 0 {
		s.reportCorrupt(int(vals[0]), []string{key})
	}
	*out = decision(r.Params, vals[2:])
	return nil
}
