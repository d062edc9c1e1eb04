package redis

import (
	"context"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store"
)

// CheckParts decides reqs as Check does, and reports each part as soon as
// it ends: it calls part with the indexes into reqs of the requests
// decided (err nil, their decisions in out) or not decided (err, which
// wraps sluice.ErrStoreUnavailable, says why). Every request is reported
// once, before CheckParts returns, by calls made one at a time on the
// caller's goroutine. On a Redis Cluster, the requests of each master are
// sent in a call of their own, concurrently, and reported when that
// master answers: a master that does not answer (down, unreachable)
// holds up only its own requests, which fail at the deadline of ctx.
// When a request is invalid, or the store is closed, CheckParts decides
// nothing, reports nothing and returns the error (that of Check);
// otherwise it returns nil. part must neither keep nor change idx.
func (s *Store) CheckParts(ctx context.Context, reqs []store.Request, out []sluice.Decision, part func(idx []int, err error)) error {
	if err := s.begin(reqs, out); err != nil || len(reqs) == 0 {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if !s.cluster || len(reqs) == 1 && reqs[0].Params.Algorithm != sluice.SlidingWindowLog {
		// One node: one pipeline, reported at once.
		failed, err := s.checkEach(ctx, reqs, out)
		s.reportOne(len(reqs), failed, err, part)
		return nil
	}
	groups := s.splitEach(reqs)
	nodes := s.byNode(groups)
	if len(nodes) <= 1 {
		res, err := s.exec(ctx, groups)
		s.report(reqs, out, groups, res, err, part)
		return nil
	}
	// A goroutine per master, each a pipelined call of its groups: the
	// client would otherwise wait for every master before answering any.
	type done struct {
		groups []*group
		res    [][]int64
		err    error
	}
	ch := make(chan done, len(nodes))
	for _, gs := range nodes {
		go func() {
			res, err := s.exec(ctx, gs)
			ch <- done{gs, res, err}
		}()
	}
	for range nodes {
		d := <-ch
		s.report(reqs, out, d.groups, d.res, d.err, part)
	}
	return nil
}

// first is the index list of a call of one request.
var first = [1]int{0}

// reportOne reports the n requests of a call on one node to part: those
// decided, then those failed (with err).
func (s *Store) reportOne(n int, failed []int, err error, part func([]int, error)) {
	if len(failed) == 0 {
		if n == 1 {
			part(first[:], nil)
			return
		}
		part(seq(n), nil)
		return
	}
	if len(failed) < n {
		done := make([]int, 0, n-len(failed))
		j := 0
		for i := range n {
			if j < len(failed) && failed[j] == i {
				j++
				continue
			}
			done = append(done, i)
		}
		part(done, nil)
	}
	part(failed, err)
}

// report fills out with the replies res of groups, and reports each group
// to part: decided, or failed with err.
func (s *Store) report(reqs []store.Request, out []sluice.Decision, groups []*group, res [][]int64, err error, part func([]int, error)) {
	for i, r := range res {
		if r == nil {
			part(groups[i].idx, err)
			continue
		}
		s.fill(reqs, out, groups[i].idx, r)
		part(groups[i].idx, nil)
	}
}

// byNode returns groups sorted into the calls of CheckParts: one per
// master of a Redis Cluster, by the slot map last read (see slotMap). It
// returns nil on a standalone server, when the map is unknown, or when
// every group lies on one master. A map gone stale (a slot moved since)
// misplaces some groups, which the client still sends to the right
// master; such a call then waits for two masters.
func (s *Store) byNode(groups []*group) [][]*group {
	if !s.cluster || len(groups) < 2 {
		return nil
	}
	m := s.slots.Load()
	if time.Since(time.Unix(0, s.slotsTried.Load())) > slotMapAge {
		s.refreshSlots()
	}
	if m == nil {
		return nil
	}
	var idBuf [8]uint16
	ids := idBuf[:0]                  // the masters, in order of first appearance
	which := make([]int, len(groups)) // the index in ids of each group's master
	for i, g := range groups {
		n := m.node[slotOf(g.keys[0])]
		k := slices.Index(ids, n)
		if k < 0 {
			k = len(ids)
			ids = append(ids, n)
		}
		which[i] = k
	}
	if len(ids) == 1 {
		return nil
	}
	// One backing array, cut per master.
	ends := make([]int, len(ids))
	for _, k := range which {
		ends[k]++
	}
	for k := 1; k < len(ends); k++ {
		ends[k] += ends[k-1]
	}
	flat := make([]*group, len(groups))
	nodes := make([][]*group, len(ids))
	for k := range nodes {
		lo := 0
		if k > 0 {
			lo = ends[k-1]
		}
		nodes[k] = flat[lo:lo:ends[k]]
	}
	for i, g := range groups {
		nodes[which[i]] = append(nodes[which[i]], g)
	}
	return nodes
}

// slotMapAge is how long after a read of the slot map (successful or
// not) a call reads it again, in the background.
const slotMapAge = 10 * time.Second

// slotMap says which master served each slot of a Redis Cluster when it
// was read (CLUSTER SLOTS). Masters are numbered in the order of the
// reply; 0 is a slot no master served.
type slotMap struct {
	node [16384]uint16
}

// refreshSlots reads the slot map again in the background, unless a read
// is under way or the store is closed. Close waits for it.
func (s *Store) refreshSlots() {
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	if s.slotsReading || s.closed.Load() {
		return
	}
	s.slotsReading = true
	s.slotsTried.Store(time.Now().UnixNano())
	s.slotsWG.Add(1)
	go func() {
		defer s.slotsWG.Done()
		ctx, cancel := context.WithTimeout(s.stop, s.timeout)
		m, err := s.readSlots(ctx)
		cancel()
		if err == nil {
			s.slots.Store(m)
		}
		s.slotsMu.Lock()
		s.slotsReading = false
		s.slotsMu.Unlock()
	}()
}

// readSlots reads the slot map of the cluster.
func (s *Store) readSlots(ctx context.Context) (*slotMap, error) {
	c := s.client
	ranges, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, s.unavailable(err)
	}
	m := new(slotMap)
	masters := map[string]uint16{}
	for _, r := range ranges {
		f, err := r.ToArray()
		if err != nil || len(f) < 3 {
			continue
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		node, err3 := f[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(node) < 2 || lo < 0 || hi >= int64(len(m.node)) || lo > hi {
			continue
		}
		host, err1 := node[0].ToString()
		port, err2 := node[1].AsInt64()
		if err1 != nil || err2 != nil {
			continue
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		n, ok := masters[addr]
		if !ok {
			n = uint16(len(masters) + 1)
			masters[addr] = n
		}
		for sl := lo; sl <= hi; sl++ {
			m.node[sl] = n
		}
	}
	return m, nil
}
