// Fixed-window checks as plain pipelined commands, without a script.

package redis

import (
	"context"
	_ "embed"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// A script call costs Redis far more than the one HINCRBY a fixed window
// needs (docs/redis.md, "Sizing"), so the common fixed-window check is
// that HINCRBY alone, sent in the same pipeline as the call's scripts (on
// a cluster, to the master whose clock placed it: see masters.go) and
// decided from its reply: admitted when the count it answers is within
// the limit.
//
// Which checks: a fixed window decided at Redis' clock (no Now, no
// After), not all or nothing, of cost 1, or of any positive cost when the
// window counts refused requests (Params.CountRefused), whose algorithm is
// then exactly "add the cost, refuse above the limit". Every other check
// takes the scripts, as do the checks of a key that another request of the
// same call sends to a script (so that the key's requests stay in order).
//
// The window is Redis' clock's: the field counted is the start of the
// window in which Redis runs the HINCRBY, which the store takes from its
// estimate of Redis' clock (serverClock, read every second). A check is
// sent plain only when the estimate, widened by its error and plainMargin,
// lies within one window; and when its reply comes back, the window is
// checked again at that instant (Redis ran the command between the send
// and the reply). A reply too late to be sure (a round trip longer than
// the margin, across a boundary) has its count given back and is decided
// again by the script at Redis' clock.
//
// Why the decisions are exact with unit costs although a refused count is
// given back only later, and others see it meanwhile. Call A the units
// admitted in the window's field and P the refused units not yet given
// back, so the field holds A + P. Invariant: P > 0 implies A >= N (the
// limit). A refusal's HINCRBY answers A + P + 1 > N: if P was 0 then
// A >= N, and if P > 0 then A >= N already, so A >= N holds with P + 1.
// Giving back lowers P and leaves A. An admission answers A + P + 1 <= N,
// so A + P < N, so P = 0 by the invariant: it saw exactly the admitted
// count, as in the serial order of the HINCRBYs, and A stays at most N. A
// refusal saw A >= N: refused in that order too. So every check is
// decided as if the HINCRBYs ran one after the other with refusals not
// counted, and exactly N are admitted whatever races
// (TestPlainFixedWindowExact). With a larger cost a refusal could be
// counted while A < N and refuse a later check that fits, hence cost 1
// (under CountRefused a refusal counts, so there is nothing to give
// back).
//
// The proof holds for one limit per key. The priorities of a rule share
// a key with different limits: there a refusal at a lower limit, until
// given back, may refuse a check at a higher limit that the serial order
// would admit (never admit one it would refuse).
//
// What follows a check is queued and sent in the background (followUp):
// a refusal's count given back by fwback.lua, and a window's first count
// (the reply equals the cost) given the window's expiry, and the previous
// window's field dropped. No decision waits for them or depends on them
// (by the proof, giving a refusal back late changes no decision at one
// limit). A process that dies with follow-ups queued leaves refusals
// counted until the window ends (refusing the higher priorities of the
// key, as above) and keys without their window's expiry: a key of the
// previous window keeps that window's expiry and so loses the new
// window's count at most a margin (Config.ExpiryMargin) into it, which
// may then admit up to its limit again, once; a new key keeps no expiry
// until its next window's first count, or forever if none comes (a small
// hash per key checked at the instant of the crash).

// plainMargin widens the estimate of Redis' clock at the send of a plain
// check: the time the command may take to reach Redis and run.
const plainMargin = 2 * time.Millisecond

// plainMaxCost bounds the cost and the limit of a plain check counting
// refused requests, so that counts stay far below algorithm.MaxExact.
const plainMaxCost = 1 << 32

var (
	//go:embed fwback.lua
	fwBackSource string

	fwBackScript = newScript(fwBackSource)
)

// PlainChecks returns how many fixed-window checks that could be plain
// (see Config.ScriptsOnly) the store has decided, since it was created, by
// their plain HINCRBY, and how many it sent to a script instead (see
// Config.OnPlain). Both stay 0 with ScriptsOnly.
func (s *Store) PlainChecks() (plain, script uint64) { return s.plainN.Load(), s.scriptN.Load() }

// notePlain counts plain checks decided plain and sent to a script.
func (s *Store) notePlain(plain, script int) {
	if plain == 0 && script == 0 {
		return
	}
	if plain > 0 {
		s.plainN.Add(uint64(plain))
	}
	if script > 0 {
		s.scriptN.Add(uint64(script))
	}
	if s.onPlain != nil {
		s.onPlain(plain, script)
	}
}

// plainCheck is a request sent as a plain HINCRBY.
type plainCheck struct {
	i     int     // index into the batch
	key   string  // Redis key
	field string  // the window's start in quanta, decimal
	start int64   // the window's start, in quanta
	t     int64   // the instant of the check (the earliest estimate at the send), in quanta
	m     *master // on a cluster, the master whose clock placed the check
}

// plainEligible reports whether r may be decided by a plain HINCRBY, the
// window aside.
func plainEligible(r *store.Request) bool {
	p := r.Params
	if p.Algorithm != sluice.FixedWindow || p.DenyAll || !r.Now.IsZero() || r.After > 0 {
		return false
	}
	if p.CountRefused {
		return r.Cost > 0 && r.Cost <= plainMaxCost && p.Limit <= plainMaxCost
	}
	return r.Cost == 1 && p.Limit >= 1
}

// planPlain returns the requests of reqs to send as plain HINCRBYs at the
// local instant now, or nil, and how many of reqs are plainEligible: none
// with Config.ScriptsOnly, none without a fresh estimate of the clock of
// Redis (on a cluster, of the master of the key's slot, see masters.go),
// and none whose window is uncertain (see plainMargin).
func (s *Store) planPlain(reqs []store.Request, now time.Time) (plain []plainCheck, eligible int) {
	if s.noPlain {
		return nil, 0
	}
	var m *slotMap
	if s.cluster {
		s.refreshSlotsAfter(now, slotMapAge)
		if m = s.slots.Load(); m == nil {
			return nil, countEligible(reqs)
		}
	}
	var (
		clk            *serverClock // the clock of the estimate below
		server, e, low int64
		known          bool
	)
	for i := range reqs {
		r := &reqs[i]
		if !plainEligible(r) {
			continue
		}
		eligible++
		var key string
		var ms *master
		c := &s.clock
		if m != nil {
			key = redisKey(s.prefix, r.Key, s.maxKey)
			n := m.node[slotOf(key)]
			if n == 0 || m.masters[n-1].client == nil {
				continue
			}
			ms = &m.masters[n-1]
			c = &ms.clock.serverClock
		}
		if c != clk {
			clk = c
			if server, e, known = c.at(now); !known {
				// The scripts decide until the first reading.
				if ms != nil {
					if c.last.Load() != nil {
						// Read before, not for clockFresh: the master
						// may have failed over, which only a new slot
						// map shows (the scripts follow the client's).
						s.refreshSlotsAfter(now, downReread)
					}
					s.startMasterClock(ms)
				} else {
					s.startClock()
				}
				continue
			}
			// The instant reported (reset and retry after) is the earliest
			// Redis' clock may show, so that a check waiting that long
			// comes after the window's end on Redis' clock.
			low = server - e
			e += plainMargin.Microseconds()
		}
		if !known {
			continue
		}
		q, w := r.Params.Quantum, r.Params.Window
		start := server / q / w * w
		if server-e < start*q || server+e >= (start+w)*q {
			continue
		}
		t := low / q
		if plain == nil {
			plain = make([]plainCheck, 0, len(reqs)-i)
		}
		if key == "" {
			key = redisKey(s.prefix, r.Key, s.maxKey)
		}
		plain = append(plain, plainCheck{i: i, key: key, start: start, t: t, m: ms})
	}
	if len(plain) == 0 || len(plain) == len(reqs) {
		return plain, eligible
	}
	// A key that a script decides too stays with the script.
	scripted := make(map[string]struct{})
	j := 0
	for i := range reqs {
		if j < len(plain) && plain[j].i == i {
			j++
			continue
		}
		scripted[reqs[i].Key] = struct{}{}
	}
	kept := plain[:0]
	for _, c := range plain {
		if _, ok := scripted[reqs[c.i].Key]; !ok {
			kept = append(kept, c)
		}
	}
	return kept, eligible
}

// countEligible returns how many of reqs are plainEligible.
func countEligible(reqs []store.Request) int {
	n := 0
	for i := range reqs {
		if plainEligible(&reqs[i]) {
			n++
		}
	}
	return n
}

// checkEach decides reqs on their own (Check, and CheckParts per master):
// the plain checks as HINCRBYs, the others in script calls, all in one
// pipeline (on a cluster, the HINCRBYs on the connection of their
// master's node: see execPlain). It returns the indexes, ascending, of the requests it
// could not decide, and why.
func (s *Store) checkEach(ctx context.Context, reqs []store.Request, out []sluice.Decision) ([]int, error) {
	plain, eligible := s.planPlain(reqs, time.Now())
	if len(plain) == 0 {
		s.notePlain(0, eligible)
	}
	if len(plain) == 0 && len(reqs) == 1 && reqs[0].Params.Algorithm != sluice.SlidingWindowLog {
		if err := s.checkOne(ctx, &reqs[0], &out[0]); err != nil {
			return first[:], err
		}
		return nil, nil
	}
	var groups []*group
	switch {
	case len(plain) == 0:
		groups = s.splitEach(reqs)
	case len(plain) < len(reqs):
		groups = s.splitRest(reqs, plain)
	}
	c := s.client
	cmds := make(rueidis.Commands, len(plain))
	for j := range plain {
		pc := &plain[j]
		pc.field = strconv.FormatInt(pc.start, 10)
		cmds[j] = c.B().Hincrby().Key(pc.key).Field(pc.field).Increment(reqs[pc.i].Cost).Build()
	}
	res, replies, err := s.execPlain(ctx, groups, plain, cmds)
	var failed []int
	for g, r := range res {
		if r == nil {
			failed = append(failed, groups[g].idx...)
			continue
		}
		s.fill(reqs, out, groups[g].idx, r)
	}
	if len(plain) > 0 {
		f, decided, redone, perr := s.settlePlain(ctx, reqs, out, plain, replies)
		s.notePlain(decided, eligible-len(plain)+redone)
		failed = append(failed, f...)
		if err == nil {
			err = perr
		}
	}
	if len(failed) == 0 {
		return nil, nil
	}
	slices.Sort(failed)
	return failed, err
}

// splitRest is splitEach for the requests of reqs that plain does not
// hold.
func (s *Store) splitRest(reqs []store.Request, plain []plainCheck) []*group {
	rest := make([]int, 0, len(reqs)-len(plain))
	sub := make([]store.Request, 0, len(reqs)-len(plain))
	j := 0
	for i := range reqs {
		if j < len(plain) && plain[j].i == i {
			j++
			continue
		}
		rest = append(rest, i)
		sub = append(sub, reqs[i])
	}
	groups := s.splitEach(sub)
	for _, g := range groups {
		for k, i := range g.idx {
			g.idx[k] = rest[i]
		}
	}
	return groups
}

// settlePlain decides the plain checks from the replies of their
// HINCRBYs, queues their follow-ups (see followUp), and decides again with
// the scripts those whose window is uncertain or whose key the HINCRBY
// could not count (another type: the layout of earlier versions, or
// corrupt), or that a cluster's node refused to run (a redirection: see
// masters.go). It returns the indexes of the requests it could not
// decide, and why, and how many checks it decided from their replies and
// decided again.
func (s *Store) settlePlain(ctx context.Context, reqs []store.Request, out []sluice.Decision, plain []plainCheck, replies []rueidis.RedisResult) (failed []int, decided, redone int, ferr error) {
	now := time.Now()
	var (
		clk       *serverClock // the clock of the estimate below
		server, e int64
		known     bool
		back      []followUp // counts to give back before deciding again
		redo      []int      // indexes in plain of the checks to decide again
	)
	for j := range plain {
		pc := &plain[j]
		r := &reqs[pc.i]
		p := r.Params
		v, err := replies[j].AsInt64()
		if err != nil {
			if re, ok := rueidis.IsRedisErr(err); ok {
				if _, moved := re.IsMoved(); moved {
					s.refreshSlotsAfter(now, movedReread) // the slot map is stale
				}
				redo = append(redo, j)
				continue
			}
			if s.cluster {
				// A node unreachable, or its connection replaced by the
				// client: read the slot map and the node clients again.
				s.refreshSlotsAfter(now, downReread)
			}
			failed = append(failed, pc.i)
			if ferr == nil {
				ferr = s.unavailable(err)
			}
			continue
		}
		c := &s.clock
		if pc.m != nil {
			c = &pc.m.clock.serverClock
		}
		if c != clk {
			clk = c
			server, e, known = c.at(now)
			e += plainMargin.Microseconds()
		}
		end := (pc.start + p.Window) * p.Quantum
		if !known || server+e >= end {
			// Redis may have run it in the next window: give it back and
			// decide it with the script.
			back = append(back, followUp{key: pc.key, field: pc.field, n: r.Cost})
			redo = append(redo, j)
			continue
		}
		limit, cost := p.Limit, r.Cost
		reset := pc.start + p.Window - pc.t
		var d [5]int64 // allowed, reason, remaining, reset after, retry after
		switch {
		case v <= limit:
			d = [5]int64{1, 0, limit - v, reset, 0}
		case p.CountRefused && cost > p.Burst:
			d = [5]int64{0, int64(sluice.ReasonCostExceedsCapacity), 0, reset, 0}
		case p.CountRefused:
			d = [5]int64{0, int64(sluice.ReasonLimited), 0, reset, reset}
		default:
			d = [5]int64{0, int64(sluice.ReasonLimited), max(limit-v+cost, 0), reset, reset}
			s.queueFollowUp(followUp{key: pc.key, field: pc.field, n: cost})
		}
		out[pc.i] = decision(p, d[:])
		decided++
		if v == cost {
			f := followUp{first: true, key: pc.key, field: pc.field, n: (end+999)/1000 + s.margin}
			if pc.start >= p.Window {
				f.prev = strconv.FormatInt(pc.start-p.Window, 10)
			}
			s.queueFollowUp(f)
		}
	}
	if len(back) > 0 {
		s.doFollowUps(ctx, back)
	}
	if len(redo) == 0 {
		return failed, decided, 0, ferr
	}
	// Decide them again with the scripts, in the order of reqs.
	sub := make([]store.Request, len(redo))
	idx := make([]int, len(redo))
	for k, j := range redo {
		idx[k] = plain[j].i
		sub[k] = reqs[idx[k]]
	}
	subOut := make([]sluice.Decision, len(sub))
	groups := s.splitEach(sub)
	res, err := s.exec(ctx, groups)
	for g, r := range res {
		if r == nil {
			for _, k := range groups[g].idx {
				failed = append(failed, idx[k])
			}
			continue
		}
		s.fill(sub, subOut, groups[g].idx, r)
		for _, k := range groups[g].idx {
			out[idx[k]] = subOut[k]
		}
	}
	if ferr == nil {
		ferr = err
	}
	return failed, decided, len(redo), ferr
}
