package globalsync

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// outbox holds this region's newest count per window until JetStream has
// acknowledged it: Observe writes it, the flush loop reads what grew. It
// holds at most max windows; past that, Observe drops the counts of new
// windows (counted) until the windows held expire or are acknowledged.
// Because counts are cumulative, a dropped count is repaired by the
// window's next Observe that finds room.
type outbox struct {
	seed    maphash.Seed
	max     int64
	size    atomic.Int64 // windows held, over all shards
	dropped atomic.Int64 // counts refused: table full, or a window no message can carry
	shards  [numShards]outShard
}

type outShard struct {
	mu    sync.Mutex
	m     map[Window]*outEntry
	dirty []*outEntry // entries whose count grew since they were last taken
	_     [64]byte
}

// outEntry is one window's count on its way out. Guarded by its shard's mu.
type outEntry struct {
	w      Window
	count  int64 // the newest count observed
	sent   int64 // the newest count handed to a publish that has not failed
	acked  int64 // the newest count JetStream acknowledged
	queued bool  // in the shard's dirty list
}

func newOutbox(max int) *outbox {
	o := &outbox{seed: maphash.MakeSeed(), max: int64(max)}
	for i := range o.shards {
		o.shards[i].m = make(map[Window]*outEntry)
	}
	return o
}

func (o *outbox) shard(key string) *outShard {
	return &o.shards[maphash.String(o.seed, key)&(numShards-1)]
}

// observe records count for w if it is larger than the one held. It does
// not allocate once w is held.
func (o *outbox) observe(w Window, count int64) {
	sh := o.shard(w.Key)
	sh.mu.Lock()
	e := sh.m[w]
	if e == nil {
		if o.size.Load() >= o.max || !carriable(w, count) {
			sh.mu.Unlock()
			o.dropped.Add(1)
			return
		}
		e = &outEntry{w: w}
		sh.m[w] = e
		o.size.Add(1)
	}
	if count > e.count {
		e.count = count
		if !e.queued {
			e.queued = true
			sh.dirty = append(sh.dirty, e)
		}
	}
	sh.mu.Unlock()
}

// count returns the newest count observed for w, 0 when none is held.
func (o *outbox) count(w Window) int64 {
	sh := o.shard(w.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[w]; e != nil {
		return e.count
	}
	return 0
}

// ackedCount returns the newest count of w that JetStream acknowledged:
// about what the other regions have received of it.
func (o *outbox) ackedCount(w Window) int64 {
	sh := o.shard(w.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[w]; e != nil {
		return e.acked
	}
	return 0
}

// carriable reports whether a message can carry w's count.
func carriable(w Window, count int64) bool {
	e := Entry{Window: w, Count: count}
	return e.validate() == nil
}

// take appends to dst the windows whose count grew since last taken,
// marking them sent, and returns dst.
func (o *outbox) take(dst []Entry) []Entry {
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		for _, e := range sh.dirty {
			e.queued = false
			if e.count > e.sent {
				dst = append(dst, Entry{Window: e.w, Count: e.count})
				e.sent = e.count
			}
		}
		clear(sh.dirty) // drop the pointers, keep the room
		sh.dirty = sh.dirty[:0]
		sh.mu.Unlock()
	}
	return dst
}

// acked records that JetStream stored the counts of entries.
func (o *outbox) acked(entries []Entry) {
	for _, x := range entries {
		sh := o.shard(x.Key)
		sh.mu.Lock()
		if e := sh.m[x.Window]; e != nil {
			e.acked = max(e.acked, x.Count)
		}
		sh.mu.Unlock()
	}
}

// failed puts the windows of entries, whose publish failed, back in line:
// the next take sends their newest count.
func (o *outbox) failed(entries []Entry) {
	for _, x := range entries {
		sh := o.shard(x.Key)
		sh.mu.Lock()
		if e := sh.m[x.Window]; e != nil && e.acked < e.count {
			e.sent = e.acked
			if !e.queued {
				e.queued = true
				sh.dirty = append(sh.dirty, e)
			}
		}
		sh.mu.Unlock()
	}
}

// sweep drops the windows expired at now and, when the table is more
// than three quarters full, the windows whose newest count is
// acknowledged (a later Observe adds them again).
func (o *outbox) sweep(now, grace int64) {
	prune := o.size.Load() > o.max/4*3
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		for w, e := range sh.m {
			if w.end()+grace <= now || prune && e.acked >= e.count && !e.queued {
				if e.queued { // an expired window still in line: take skips it
					e.count, e.sent = 0, 0
				}
				delete(sh.m, w)
				o.size.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// pending returns the number of windows whose newest count JetStream has
// not acknowledged.
func (o *outbox) pending() int {
	n := 0
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if e.acked < e.count {
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}
