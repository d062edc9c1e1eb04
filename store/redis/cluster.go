// Splitting a batch into script calls by cluster slot.

package redis

import (
	"math"
	"slices"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// split groups reqs into script calls: one on a standalone server, one
// per slot on a cluster, in the order of first appearance. In modeEach a
// call takes at most maxCallWork of work (see callWork): the requests
// beyond go in further calls, sent after it on the same connection, so
// still in order.
func (s *Store) split(reqs []store.Request, mode, ttlMS string) []*group {
	head := []string{mode, s.marginMS, ttlMS}
	capped := mode == modeEach
	var groups []*group
	var one *group // standalone: the call being filled
	var bySlot map[uint16]*group
	for i := range reqs {
		r := &reqs[i]
		k := redisKey(s.prefix, r.Key, s.maxKey)
		var sl uint16
		g := one
		if s.cluster {
			if bySlot == nil {
				bySlot = map[uint16]*group{}
			}
			sl = slotOf(k)
			g = bySlot[sl]
		}
		w := callWork(r)
		if g == nil || capped && g.work > 0 && g.work+w > maxCallWork {
			n := len(reqs) - i // at most, in this call
			if capped {
				n = min(n, maxCallWork)
			}
			g = &group{script: checkScript, args: append(make([]string, 0, 3+9*n), head...)}
			if !s.cluster {
				g.idx, g.keys = make([]int, 0, n), make([]string, 0, n)
			}
			groups = append(groups, g)
			if s.cluster {
				bySlot[sl] = g
			} else {
				one = g
			}
		}
		g.work += w
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, k)
		g.args = appendArgs(g.args, r)
	}
	return groups
}

// Bounds on the Redis work of one script call, counted by store.Work. A
// batch decided request by request (Check, CheckParts) is split into calls
// of at most maxCallWork, pipelined on the same connection, between which
// Redis serves its other clients. An all-or-nothing batch is one call per
// slot whatever its work: Info reports maxAtomicWork, beyond which the
// engine refuses it.
const (
	// maxCallWork bounds the work of one call: 128 checks of
	// checkeach.lua, 21 sliding window logs of cost 1, or one of cost
	// 100 or more; measured on a loaded machine, 0.6-1ms of Redis time
	// (TestCheckCallWorkBounded).
	maxCallWork = 128
	// maxAtomicWork is the most work of an all-or-nothing batch (see
	// store.Info.MaxAtomicWork), as much as one call of a batch decided
	// request by request: 128 checks of most algorithms, 21 sliding window
	// logs of cost 1, one of cost 100 or more. Measured on a loaded
	// machine, 0.3-0.8ms of Redis time on keys in use, 1-1.5ms on new
	// keys (TestAtomicWorkBounded, TestAtomicBatchWorkBounded).
	maxAtomicWork = maxCallWork
)

// callWork returns the work of r in a script call.
func callWork(r *store.Request) int { return store.Work(r) }

// maxEachChecks is the most requests of one checkeach.lua call: its
// binary argument numbers parameter sets in 16 bits.
const maxEachChecks = math.MaxUint16

// splitEach groups reqs for Check: the requests of every algorithm but the
// sliding window log go to checkeach.lua, one call for a standalone server
// and one per slot on a cluster; those of sliding window logs go to
// check.lua, grouped as split does; a call takes at most maxCallWork of
// work (see callWork). exec sends the calls together, so that on one
// connection they are one write. Within a call Redis decides the requests
// in the order of reqs, and two requests of one key share an algorithm, so
// they go the same way and the second sees the first.
func (s *Store) splitEach(reqs []store.Request) []*group {
	var (
		groups []*group
		logs   []int
		one    *group // standalone: the one checkeach.lua call
		bySlot map[uint16]*group
	)
	for i := range reqs {
		r := &reqs[i]
		if r.Params.Algorithm == sluice.SlidingWindowLog {
			logs = append(logs, i)
			continue
		}
		g := one
		k := redisKey(s.prefix, r.Key, s.maxKey)
		if s.cluster {
			if bySlot == nil {
				bySlot = map[uint16]*group{}
			}
			sl := slotOf(k)
			if g = bySlot[sl]; g == nil {
				g = &group{script: checkEachScript}
				bySlot[sl] = g
				groups = append(groups, g)
			}
		} else if g == nil {
			n := min(len(reqs), maxEachChecks, maxCallWork)
			g = &group{script: checkEachScript, idx: make([]int, 0, n), keys: make([]string, 0, n)}
			one = g
			groups = append(groups, g)
		}
		if len(g.idx) == min(maxEachChecks, maxCallWork) {
			// The call is full: the next requests go in another, sent
			// after it on the same connection, so still in order.
			g = &group{script: checkEachScript}
			if s.cluster {
				bySlot[slotOf(k)] = g
			} else {
				one = g
			}
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, k)
	}
	for _, g := range groups {
		s.eachArgs(g, reqs, eachEach)
	}
	if len(logs) == 0 {
		return groups
	}
	sub := make([]store.Request, len(logs))
	for j, i := range logs {
		sub[j] = reqs[i]
	}
	for _, g := range s.split(sub, modeEach, "") {
		for j, k := range g.idx {
			g.idx[j] = logs[k]
		}
		groups = append(groups, g)
	}
	return groups
}

// allEach returns the checkeach.lua call that decides reqs all or
// nothing, or nil when check.lua must: a sliding window log, a key that
// appears twice (checkeach.lua holds its writes back until every check is
// decided, so a second check of a key would not see the first), more
// requests than a call takes, or keys on several slots of a cluster.
func (s *Store) allEach(reqs []store.Request) *group {
	if len(reqs) > maxEachChecks {
		return nil
	}
	g := &group{script: checkEachScript, idx: make([]int, len(reqs)), keys: make([]string, len(reqs))}
	var seen map[string]struct{} // past 8 keys
	for i := range reqs {
		if reqs[i].Params.Algorithm == sluice.SlidingWindowLog {
			return nil
		}
		k := redisKey(s.prefix, reqs[i].Key, s.maxKey)
		if s.cluster && i > 0 && slotOf(k) != slotOf(g.keys[0]) {
			return nil
		}
		if seen != nil {
			if _, ok := seen[k]; ok {
				return nil
			}
			seen[k] = struct{}{}
		} else if slices.Contains(g.keys[:i], k) {
			return nil
		}
		g.idx[i], g.keys[i] = i, k
		if i == 8 {
			seen = make(map[string]struct{}, len(reqs))
			for _, q := range g.keys[:i+1] {
				seen[q] = struct{}{}
			}
		}
	}
	s.eachArgs(g, reqs, eachAll)
	return g
}
