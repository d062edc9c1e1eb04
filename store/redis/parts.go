package redis

import (
	"context"
	"net"
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
	parts := s.byMaster(reqs)
	if parts == nil {
		// One node: one pipeline, reported at once.
		failed, err := s.checkEach(ctx, reqs, out)
		s.reportOne(len(reqs), failed, err, part)
		return nil
	}
	// A goroutine per master, each deciding its requests as Check does
	// (plain commands and script calls in one pipeline): the client would
	// otherwise wait for every master before answering any. Their requests
	// and decisions are cut from one array each.
	type done struct {
		idx    []int
		out    []sluice.Decision
		failed []int // indexes into idx
		err    error
	}
	ch := make(chan done, len(parts))
	subReqs := make([]store.Request, len(reqs))
	subOut := make([]sluice.Decision, len(reqs))
	lo := 0
	for _, idx := range parts {
		sub, d := subReqs[lo:lo+len(idx)], done{idx: idx, out: subOut[lo : lo+len(idx)]}
		lo += len(idx)
		go func() {
			for k, i := range idx {
				sub[k] = reqs[i]
			}
			d.failed, d.err = s.checkEach(ctx, sub, d.out)
			ch <- d
		}()
	}
	for range parts {
		d := <-ch
		if len(d.failed) == 0 { // the common case: idx is the store's own
			for k, i := range d.idx {
				out[i] = d.out[k]
			}
			part(d.idx, nil)
			continue
		}
		ok := make([]int, 0, len(d.idx)-len(d.failed))
		bad := make([]int, 0, len(d.failed))
		f := 0
		for k, i := range d.idx {
			if f < len(d.failed) && d.failed[f] == k {
				f++
				bad = append(bad, i)
				continue
			}
			out[i] = d.out[k]
			ok = append(ok, i)
		}
		if len(ok) > 0 {
			part(ok, nil)
		}
		part(bad, d.err)
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

// slotMapAge is how long after a read of the slot map (successful or
// not) a call reads it again, in the background.
const slotMapAge = 10 * time.Second

// slotMap says which master served each slot of a Redis Cluster when it
// was read (CLUSTER SLOTS). Masters are numbered from 1 in the order of
// the reply; 0 is a slot no master served. masters[n-1] is master n (see
// masters.go).
type slotMap struct {
	node    [16384]uint16
	masters []master
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
	var addrs []string
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
			addrs = append(addrs, addr)
		}
		for sl := lo; sl <= hi; sl++ {
			m.node[sl] = n
		}
	}
	s.setMasters(m, addrs)
	return m, nil
}
