// Repeated keys of an all-or-nothing store call: the checks of one key go to
// the store as at most three requests, whatever their number, and each check
// gets back the decision it would have had on its own.

package engine

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/share"
	"github.com/sluicehq/sluice/store"
)

// A batch of n checks of one key, decided all or nothing, is admitted
// exactly when one check of their summed cost would be, for every algorithm:
// each admits a cost c exactly when c fits in the room the key has left (in
// whole units), and admitting c takes exactly c from it. What differs is
// each check's own decision: its remaining units, reset and retry-after.
// For the fixed window and the sliding window log these follow from at
// most three requests, which is what the engine sends: the checks' summed
// cost in two parts of at most the capacity each (see parts), and a read of
// the key before them when the first check only reads. The first part
// tells the key's room R0, and its reset:
//
//   - admitted: check j leaves Remaining R0 - P (P the costs up to and
//     including j), and, once anything is counted, the reset of the first
//     part (the end of the window; the newest entry of the log, which
//     every admission writes at the same instant);
//   - denied with the key admitting the sum: every check reports the key as
//     it stands, as a read does;
//   - denied by the key: the checks are replayed in order against R0, as
//     the store would decide them one by one, the ones that fit taking
//     their cost; one that does not fit reports R0 - A (A the cost taken
//     before it), the window's end as reset and retry-after (fixed window),
//     or the instant the log's entries leave the window.
//
// The one figure these requests cannot give is the retry-after of a
// log check denied while entries older than the batch stand in its way:
// it is reported as the retry-after of the part the key denied, which is
// exact when the check's cost and what the checks before it took add up to
// that part's total, or to more than the limit (then only entries of this
// instant stand in the way, as on a key not used earlier in the window);
// otherwise it is the instant a larger or smaller share of the log leaves
// the window. The first part is the first check's cost, so that on a key
// with no room left for it, and checks of one cost, it is exact.
//
// The bucket algorithms and GCRA report a reset that depends on the debt
// below one unit, the sliding window counter a reset and retry-after that
// depend on the previous window's weight: neither follows from the merged
// decisions, so their checks are not merged (a check of a repeated key
// costs Redis some microseconds for them, against a sliding window log's
// sorted-set commands per check and per entry of the batch).

// mergeable reports whether checks under p may be merged: a fixed window or
// sliding window log with a positive capacity, which neither refuses
// everything nor counts refused requests.
func mergeable(p *algorithm.Params) bool {
	return (p.Algorithm == sluice.FixedWindow || p.Algorithm == sluice.SlidingWindowLog) &&
		!p.DenyAll && !p.CountRefused && p.Burst > 0
}

// mergeGroup is the checks of one key that go to the store merged.
type mergeGroup struct {
	idx  []int // the checks, indexes into the caller's requests, in order
	at   int   // the index of its first request among the requests sent
	sent int   // its requests sent: a read and two parts at most
}

// mergePlan is an all-or-nothing call with its repeated keys merged.
type mergePlan struct {
	reqs   []store.Request
	out    []sluice.Decision
	src    []store.Source
	groups []mergeGroup
	// from[i] is the index among the requests sent of the caller's
	// request i when it is sent as it is, or -1 when it is merged.
	from []int
	// in is the caller's requests the plan was made of.
	in []store.Request
	// idx holds the groups' idx; byKey maps a key to its group while the
	// plan is made. Both are kept, empty, for the next plan.
	idx   []int
	byKey map[string]int
	// b is the memory of the merged call's store.Batch.
	b store.Batch
}

// release drops what p refers to, and keeps its memory.
func (p *mergePlan) release() {
	if p.in != nil { // a plan was made
		clear(p.reqs[:cap(p.reqs)])
		p.in = nil
	}
}

// of reports whether p is the plan of reqs: made of these very requests
// (the same slice), which the caller has not changed since.
func (p *mergePlan) of(reqs []store.Request) bool {
	return p != nil && len(reqs) > 0 && len(p.in) == len(reqs) && &p.in[0] == &reqs[0]
}

// planMerge makes in p, whose memory it reuses, the plan of reqs with
// their repeated keys merged, and returns p; or it returns nil when no key
// repeats with mergeable params (the call then goes as it is).
func planMerge(p *mergePlan, reqs []store.Request) *mergePlan {
	if !repeats(p, reqs) { // the common case, on a single check's path
		return nil
	}
	byKey := p.keys() // the group of a key, or -1
	defer clear(byKey)
	// A batch that repeats keys often has few. While they are counted, a
	// group's at is its first check and sent its checks, and from[i] the
	// group of request i, or -1.
	p.from, p.in, p.reqs = growInts(p.from, len(reqs)), reqs, p.reqs[:0]
	groups := p.groups[:0]
	for i := range reqs {
		r := &reqs[i]
		g, seen := byKey[r.Key]
		switch {
		case !seen:
			byKey[r.Key] = len(groups)
			p.from[i] = len(groups)
			groups = append(groups, mergeGroup{at: i, sent: 1})
		case g >= 0:
			first := &reqs[groups[g].at]
			if !mergeable(r.Params) || *r.Params != *first.Params || !r.Now.Equal(first.Now) || r.After != first.After {
				byKey[r.Key] = -1 // sent as they are
				p.from[i] = -1
				continue
			}
			p.from[i] = g
			groups[g].sent++
		default:
			p.from[i] = -1
		}
	}
	// The groups kept: repeated, and never found unmergeable. Their
	// checks share one allocation.
	kept, n := 0, 0
	for g := range groups {
		if groups[g].sent < 2 || byKey[reqs[groups[g].at].Key] < 0 {
			groups[g].sent = 0
			continue
		}
		kept++
		n += groups[g].sent
	}
	if kept == 0 {
		return nil
	}
	idx := slices.Grow(p.idx[:0], n)
	p.idx = idx
	for g := range groups {
		if k := groups[g].sent; k > 0 {
			groups[g].idx = idx[len(idx) : len(idx) : len(idx)+k]
			idx = idx[:len(idx)+k]
		}
	}
	for i, g := range p.from {
		if g >= 0 && groups[g].sent > 0 {
			groups[g].idx = append(groups[g].idx, i)
		}
	}
	// The requests sent: each unmerged one where it was, each merged key
	// where it first appeared (keys are independent, so the order of
	// different keys does not change any decision).
	for i := range reqs {
		g := p.from[i]
		if g < 0 || groups[g].sent == 0 {
			p.from[i] = len(p.reqs)
			p.reqs = append(p.reqs, reqs[i])
			continue
		}
		p.from[i] = -1
		if groups[g].idx[0] != i {
			continue
		}
		groups[g].at = len(p.reqs)
		p.reqs = appendParts(p.reqs, reqs, groups[g].idx)
		groups[g].sent = len(p.reqs) - groups[g].at
	}
	// Compact the groups kept, in the order of their first check.
	gs := groups[:0]
	for _, g := range groups {
		if g.idx != nil {
			gs = append(gs, g)
		}
	}
	p.groups = gs
	p.out = grow(p.out, len(p.reqs))
	return p
}

// growInts returns v resliced to n values, reallocated when it has not the
// room; the values are the caller's to set.
func growInts(v []int, n int) []int {
	if cap(v) < n {
		return make([]int, n)
	}
	return v[:n]
}

// keys returns p.byKey, empty, made at its first use.
func (p *mergePlan) keys() map[string]int {
	if p.byKey == nil {
		p.byKey = map[string]int{} // sized as it grows
	}
	return p.byKey
}

// repeats reports whether a key appears twice in reqs with params that may
// be merged; a long reqs is looked at in p's map of keys.
func repeats(p *mergePlan, reqs []store.Request) bool {
	if len(reqs) <= 16 {
		for i := range reqs {
			if !mergeable(reqs[i].Params) {
				continue
			}
			for j := range i {
				if reqs[j].Key == reqs[i].Key {
					return true
				}
			}
		}
		return false
	}
	seen := p.keys()
	defer clear(seen)
	for i := range reqs {
		if !mergeable(reqs[i].Params) {
			continue
		}
		if _, ok := seen[reqs[i].Key]; ok {
			return true
		}
		seen[reqs[i].Key] = i
	}
	return false
}

// appendParts appends the requests of the merged checks idx of reqs: a
// read when the first check reads (its decision, and that of the reads that
// follow it, is the read's), then the parts of their summed cost (see
// parts).
func appendParts(sent, reqs []store.Request, idx []int) []store.Request {
	r := reqs[idx[0]]
	if r.Cost == 0 {
		sent = append(sent, r)
	}
	for _, c := range parts(reqs, idx) {
		if c > 0 {
			r.Cost = c
			sent = append(sent, r)
		}
	}
	return sent
}

// parts splits the summed cost S of the merged checks idx of reqs, under
// their capacity K, into at most two parts of at most K: the cost of the
// first check that has one (at most K), then the rest of S up to K (0 when
// nothing is left). Their total is S when S is at most K; otherwise it is
// above K, so a part is always denied, as the checks are. A part of at most
// K is never refused as above the capacity, so a denied part reports the
// window's end. A first part of one check's cost makes the log's
// retry-after exact on a key with no room for it (see above).
func parts(reqs []store.Request, idx []int) [2]int64 {
	k := reqs[idx[0]].Params.Burst
	var sum, first int64
	for _, i := range idx {
		c := reqs[i].Cost
		if first == 0 {
			first = c
		}
		sum += c
	}
	first = min(first, k)
	return [2]int64{first, min(sum-first, k)}
}

// doMerged is Store.Do of the all-or-nothing batch b, with its repeated keys
// merged as p plans; turn, when not nil, pauses during the store call.
func doMerged(ctx context.Context, st store.Store, b *store.Batch, p *mergePlan, turn *share.Turn) error {
	p.b = store.Batch{Reqs: p.reqs, Out: p.out, All: true}
	if b.Sources != nil {
		p.src = growStoreSource(p.src, len(p.reqs))
		p.b.Sources = p.src
	}
	turn.Pause()
	err := st.Do(ctx, &p.b)
	turn.Resume(ctx)
	p.b = store.Batch{}
	if err != nil {
		return err
	}
	admitted := true
	for i := range p.out {
		admitted = admitted && p.out[i].Allowed
	}
	for i, j := range p.from {
		if j >= 0 {
			b.Out[i] = p.out[j]
			if b.Sources != nil {
				b.Sources[i] = p.src[j]
			}
		}
	}
	for _, g := range p.groups {
		spread(b.Reqs, b.Out, g.idx, p.out[g.at:g.at+g.sent], admitted)
		if b.Sources != nil {
			for _, i := range g.idx {
				b.Sources[i] = p.src[g.at+g.sent-1]
			}
		}
	}
	return nil
}

// spread writes to out the decision of each merged check idx of reqs, from
// the decisions got of the requests sent for them (see appendParts);
// admitted is the verdict of the whole call.
func spread(reqs []store.Request, out []sluice.Decision, idx []int, got []sluice.Decision, admitted bool) {
	p := reqs[idx[0]].Params
	var read *sluice.Decision
	if reqs[idx[0]].Cost == 0 {
		read, got = &got[0], got[1:]
	}
	if len(got) == 0 {
		for _, i := range idx {
			out[i] = *read // reads only
		}
		return
	}
	q := parts(reqs, idx)
	if admitted {
		// The first part took q[0] units of the key's room.
		room, sum := got[0].Remaining+q[0], int64(0)
		for _, i := range idx {
			sum += reqs[i].Cost
			if sum == 0 {
				out[i] = *read
				continue
			}
			out[i] = sluice.Decision{Allowed: true, Limit: p.Limit, Remaining: max(room-sum, 0), ResetAfter: got[0].ResetAfter}
		}
		return
	}
	// Denied, the first part reports the key as it stands: as a read
	// does when the key alone would have admitted it; with the window's
	// end or the log's newest entry, which a read reports too, when the
	// key denied it (a fixed window with no room for it has counted some).
	asRead := sluice.Decision{Limit: p.Limit, Reason: sluice.ReasonLimited, Remaining: got[0].Remaining, ResetAfter: got[0].ResetAfter}
	if read != nil {
		asRead = *read
	}
	// The part the key denied, if any, and the total cost it stood for
	// (the part before it included).
	deny, total := -1, int64(0)
	for j := range got {
		total += q[j]
		if blocking(got[j]) {
			deny = j
			break
		}
	}
	if deny < 0 {
		// The key admitted the sum: another key denied the call, and
		// every check reports the key as it stands.
		for _, i := range idx {
			out[i] = asRead
		}
		return
	}
	room, taken := asRead.Remaining, int64(0)
	for _, i := range idx {
		c := reqs[i].Cost
		if c == 0 || c <= p.Burst && taken+c <= room {
			out[i] = asRead
			taken += c
			continue
		}
		d := sluice.Decision{Limit: p.Limit, Remaining: room - taken, Reason: sluice.ReasonLimited}
		d.ResetAfter = stateReset(p, asRead, got[deny], taken)
		if c > p.Burst {
			d.Reason = sluice.ReasonCostExceedsCapacity
		} else {
			d.RetryAfter = retryAfter(p, got[deny], total, taken+c, d.ResetAfter)
		}
		out[i] = d
	}
}

// stateReset returns the reset of the key once taken units are counted on
// it: the read's when nothing is; for a fixed window, the window's end (the
// reset of the denied part) once anything is counted; for a log, the
// newest entry, written now or later, plus the window.
func stateReset(p *algorithm.Params, read, denied sluice.Decision, taken int64) time.Duration {
	if p.Algorithm == sluice.FixedWindow {
		if taken == 0 && read.ResetAfter == 0 {
			return 0
		}
		return denied.ResetAfter
	}
	if taken == 0 {
		return read.ResetAfter
	}
	return max(read.ResetAfter, p.WindowDuration())
}

// retryAfter returns the retry-after of a check denied once taken units are
// counted, whose cost brings the count to need: for a fixed window, the
// window's end; for a log, when the entries in the way leave the window,
// known when need is what the denied part stood for (total), or beyond the
// limit (only entries written now are in the way), and otherwise taken as
// the denied part's.
func retryAfter(p *algorithm.Params, denied sluice.Decision, total, need int64, reset time.Duration) time.Duration {
	if p.Algorithm == sluice.FixedWindow || need == total {
		return denied.RetryAfter
	}
	if need > p.Limit {
		return reset
	}
	return denied.RetryAfter
}

// mergeAll makes in p the merge plan of b and returns p, or returns nil
// when b goes as it is: it is not all or nothing, or no key repeats.
func mergeAll(p *mergePlan, b *store.Batch) *mergePlan {
	if !b.All || b.Once != nil || len(b.Reqs) < 2 {
		return nil
	}
	return planMerge(p, b.Reqs)
}
