package globalsync

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Window names one global limit's window: the limit's key, and the
// window's start (unix ms, a multiple of its length: start = t - t mod
// length) and length. Every region computes the same Window for the same
// instant, so their counts meet in the same G-counter.
type Window struct {
	Key    string
	Start  int64         // unix ms
	Length time.Duration // whole milliseconds
}

// WindowAt returns the window of key and length that holds instant t:
// the one starting at t - t mod length, in unix ms. length is rounded
// down to whole milliseconds, and is at least one.
func WindowAt(key string, length time.Duration, t time.Time) Window {
	ms := t.UnixMilli()
	l := max(length.Milliseconds(), 1)
	return Window{Key: key, Start: ms - ms%l, Length: time.Duration(l) * time.Millisecond}
}

// end returns the window's end in unix ms.
func (w Window) end() int64 { return w.Start + w.Length.Milliseconds() }

// previous returns the window of the same key just before w.
func (w Window) previous() Window {
	return Window{Key: w.Key, Start: w.Start - w.Length.Milliseconds(), Length: w.Length}
}

// numShards spreads the windows over that many locks, so that checks of
// different keys rarely meet on one. A power of two.
const numShards = 64

// State is the merged view of the other regions' counts: per window, a
// G-counter holding one count per origin region, merged by max. Merging
// is commutative, associative and idempotent, so redelivered, duplicated
// and reordered messages leave it unchanged, and two instances of one
// region may both publish that region's count: both read it from the
// same Redis, where it only grows, so the larger is the newer.
//
// Beside the counts it keeps, per origin and key, an estimate of the
// origin's rate (see reserve), carried from one window of a key to the
// next, and per origin its sync lag, set by SetLag.
//
// All times are unix milliseconds passed by the caller. A State is safe
// for concurrent use; Others takes a shared lock of one shard and does
// not allocate.
type State struct {
	grace int64 // ms a window is kept after its end
	flush int64 // ms, the senders' flush period, in the reserve
	max   int64 // windows held at most
	size  atomic.Int64
	seed  maphash.Seed

	shards [numShards]shard

	mu      sync.Mutex // guards origins
	origins map[string]*origin
	// known is the origins heard from, for the check path: a copy made
	// whenever one is added or forgotten.
	known atomic.Pointer[[]*origin]
}

type shard struct {
	mu sync.RWMutex
	m  map[Window]*cell
	_  [64]byte // keeps neighbouring shards' locks off one cache line
}

// origin is a region we receive counts from.
type origin struct {
	name  string
	lag   atomic.Int64 // ms, the recent p95 of its messages' lag
	heard atomic.Int64 // unix ms of its last message, a heartbeat included
}

// cell is one window's G-counter: one count per origin. There are as
// many origins as regions, a handful, so a slice beats a map.
type cell struct {
	counts []originCount
}

type originCount struct {
	o       *origin
	count   int64   // the largest count received
	sentAt  int64   // when the message carrying it was sent
	arrived int64   // when the last increase arrived, or 0
	rate    float64 // counts per ms for this key, an EWMA
}

// NewState returns an empty State holding at most maxWindows windows. A
// window's state is dropped once grace has passed after its end, in
// every region alike since the schedule depends only on the window.
// flush is the senders' flush period, which the reserve covers.
func NewState(grace, flush time.Duration, maxWindows int) *State {
	s := &State{grace: grace.Milliseconds(), flush: flush.Milliseconds(), max: int64(maxWindows), seed: maphash.MakeSeed(), origins: make(map[string]*origin)}
	for i := range s.shards {
		s.shards[i].m = make(map[Window]*cell)
	}
	return s
}

func (s *State) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)&(numShards-1)]
}

// expired reports whether w's state is to be dropped at now.
func (s *State) expired(w Window, now int64) bool { return w.end()+s.grace <= now }

// origin returns the origin named name, adding it on first sight.
func (s *State) origin(name string) *origin {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.origins[name]
	if o == nil {
		o = &origin{name: name}
		s.origins[name] = o
		s.publishKnown()
	}
	return o
}

// Origins returns the number of origins seen.
func (s *State) Origins() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.origins)
}

// SetLag sets the sync lag of origin name (ms), used by the reserve.
func (s *State) SetLag(name string, lag int64) { s.origin(name).lag.Store(lag) }

// MergeResult says what Merge did with a count.
type MergeResult int

const (
	Merged  MergeResult = iota // the count was larger than the one held, and replaced it
	Stale                      // the count was not larger (a duplicate, or reordered): ignored
	Expired                    // the window's state is already dropped: ignored
	Full                       // a new window while the State holds its most: ignored
)

// Merge folds origin's count for window w, sent at sentAt and arriving
// at now, into the state: it replaces the count held for origin when it
// is larger, and is ignored otherwise (counts only grow, so a smaller one
// is older). A window past its end and grace is ignored too, so that a
// late redelivery cannot bring it back.
func (s *State) Merge(originName string, w Window, count, sentAt, now int64) MergeResult {
	if s.expired(w, now) {
		return Expired
	}
	o := s.origin(originName)
	sh := s.shard(w.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.m[w]
	if c == nil {
		if s.size.Load() >= s.max {
			return Full
		}
		c = &cell{counts: inherit(sh.m[w.previous()])}
		sh.m[w] = c
		s.size.Add(1)
	}
	i := c.find(o)
	if i < 0 {
		// First count from this origin for the key: its rate so far is
		// count over the time since the window started.
		c.counts = append(c.counts, originCount{o: o, arrived: now - max(sentAt-w.Start, 0)})
		i = len(c.counts) - 1
	}
	oc := &c.counts[i]
	if count <= oc.count {
		return Stale
	}
	oc.rate = ewma(oc.rate, count-oc.count, now-oc.arrived)
	oc.count, oc.arrived = count, now
	oc.sentAt = max(oc.sentAt, sentAt)
	return Merged
}

// inherit returns the counts of a key's new window: zero, with the
// origins' rates and arrival times carried from the previous window, so
// that the reserve holds across the boundary.
func inherit(prev *cell) []originCount {
	if prev == nil {
		return nil
	}
	counts := make([]originCount, len(prev.counts))
	for i, p := range prev.counts {
		counts[i] = originCount{o: p.o, arrived: p.arrived, rate: p.rate}
	}
	return counts
}

func (c *cell) find(o *origin) int {
	for i := range c.counts {
		if c.counts[i].o == o {
			return i
		}
	}
	return -1
}

// Others returns, for window w at now, the sum of the origins' latest
// counts (seen) and the reserve for what they may have admitted since
// (see reserve), rounded. A window with no count yet takes its
// reserve from the key's previous window.
func (s *State) Others(w Window, now int64) (seen, reserved int64) {
	return s.OthersWithin(w, 0, now)
}

// Count returns origin's count for w, and whether there is one.
func (s *State) Count(originName string, w Window) (int64, bool) {
	sh := s.shard(w.Key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	c := sh.m[w]
	if c == nil {
		return 0, false
	}
	for _, oc := range c.counts {
		if oc.o.name == originName && oc.count > 0 {
			return oc.count, true
		}
	}
	return 0, false
}

// Counts adds to m every origin's count for w.
func (s *State) Counts(w Window, m map[string]int64) {
	sh := s.shard(w.Key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if c := sh.m[w]; c != nil {
		for _, oc := range c.counts {
			if oc.count > 0 {
				m[oc.o.name] = oc.count
			}
		}
	}
}

// Windows returns the number of windows held, expired or not.
func (s *State) Windows() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

// Sweep drops the windows whose end and grace are past at now, and
// returns how many windows remain.
func (s *State) Sweep(now int64) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for w := range sh.m {
			if s.expired(w, now) {
				delete(sh.m, w)
				s.size.Add(-1)
			}
		}
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
