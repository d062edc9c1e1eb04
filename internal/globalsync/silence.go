package globalsync

import "math"

// Silence: a region that is not heard from.
//
// Every instance sends a message at least every heartbeat period, with no
// counts when nothing grew (a heartbeat). A region heard from since its
// count for a key last grew has admitted nothing for it: its reserve
// decays (see reserve). A region not heard from at all since then may be
// admitting unseen: its reserve grows with the time unheard, at its last
// known rate. A region unheard for longer than its lag, a flush and a
// heartbeat is quiet: cut off, or NATS is down. Every other region then
// counts it as having taken at least its share of the limit (the limit
// over the number of regions known), and the quiet region, which hears
// nobody, counts every other region alike: on both sides of a partition
// each region admits within what the others could have taken, and the
// total stays within the limit plus what the regions admitted before the
// silence was noticed beyond their known rates. The price is the capacity
// the quiet regions' shares leave unused.

// heartbeatFlushes is the heartbeat period in flush periods.
const heartbeatFlushes = 10

// forgetAfter is how long, in ms, a quiet region is still counted: one
// that stays unheard that long has left (it is counted again as soon as it
// is heard).
const forgetAfter = 10 * 60 * 1000

// Heard records a message of origin name at now (unix ms).
func (s *State) Heard(name string, now int64) {
	o := s.origin(name)
	if o.heard.Load() < now {
		o.heard.Store(now)
	}
}

// quiet returns how long, in ms, o has gone unheard beyond its lag, one
// flush and one heartbeat: 0 or less while it is heard as expected.
func (s *State) quiet(o *origin, now int64) int64 {
	return now - o.heard.Load() - o.lag.Load() - s.flush - heartbeatFlushes*s.flush
}

// publishKnown makes the check path's copy of the origins. Requires mu.
func (s *State) publishKnown() {
	known := make([]*origin, 0, len(s.origins))
	for _, o := range s.origins {
		known = append(known, o)
	}
	s.known.Store(&known)
}

// forget drops the origins unheard for forgetAfter at now.
func (s *State) forget(now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.origins)
	for name, o := range s.origins {
		// An origin never heard is a configured peer (Config.Peers):
		// kept until it is heard.
		if h := o.heard.Load(); h > 0 && now-h > forgetAfter {
			delete(s.origins, name)
		}
	}
	if len(s.origins) != n {
		s.publishKnown()
	}
}

// OthersWithin is Others for a window of the global limit limit: the
// reserve of a quiet origin (see above) grows as if it went on admitting
// at its last known rate, up to its share of limit; a quiet origin with
// no count for the key counts as having taken its share. A limit of 0
// leaves the shares out.
func (s *State) OthersWithin(w Window, limit, now int64) (seen, reserved int64) {
	var known []*origin
	if p := s.known.Load(); p != nil {
		known = *p
	}
	var share int64
	if limit > 0 && len(known) > 0 {
		share = (limit + int64(len(known))) / int64(len(known)+1) // rounded up
	}
	sh := s.shard(w.Key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	c, current := sh.m[w], true
	if c == nil {
		// A window with no count yet: the reserve of the key's previous
		// window, whose rates still hold.
		c, current = sh.m[w.previous()], false
	}
	var r float64
	var extra int64
	if c != nil {
		for i := range c.counts {
			oc := &c.counts[i]
			var n int64
			if current {
				n = oc.count
			}
			seen += n
			lag := oc.o.lag.Load()
			switch heard := oc.o.heard.Load(); {
			case share > 0 && s.quiet(oc.o, now) > 0:
				r += max(reserve(oc.rate, lag, s.flush, 0), float64(share-n))
			case heard > oc.arrived:
				r += reserve(oc.rate, lag, s.flush, now-oc.arrived)
			default:
				// Unheard since its count last grew: it may be admitting
				// at its rate all that time.
				r += reserve(oc.rate, max(lag, now-oc.arrived-s.flush), s.flush, 0)
			}
		}
	}
	if share > 0 {
		for _, o := range known {
			if (c == nil || c.find(o) < 0) && s.quiet(o, now) > 0 {
				extra += share
			}
		}
	}
	if r >= math.MaxInt64/4 {
		return seen, math.MaxInt64 / 4
	}
	// Rounded to the nearest unit, not up: a reserve that decays (an
	// origin gone idle) would otherwise hold back one unit for ever. The
	// overshoot this allows is under one unit.
	return seen, int64(math.Round(r)) + extra
}

// heardRank returns the number of regions heard from at now, this one
// (self) included, and the rank of self among their names.
func (s *State) heardRank(self string, now int64) (n, rank int64) {
	n = 1
	if p := s.known.Load(); p != nil {
		for _, o := range *p {
			if s.quiet(o, now) <= 0 {
				n++
				if o.name < self {
					rank++
				}
			}
		}
	}
	return n, rank
}
