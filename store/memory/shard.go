package memory

import (
	"sync"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// chunkSize is the number of entries in one chunk of a shard's arena. A
// chunk of 256 entries is 12 KB, so a shard wastes at most that much.
const chunkSize = 256

// nilSlot marks the end of a list and an absent slot.
const nilSlot = ^uint32(0)

// entry is the state of one key: 48 bytes.
type entry struct {
	// hash is the maphash of the key under the store's seed.
	hash uint64
	// expiresAt is the instant (µs since the Unix epoch) from which state
	// is equivalent to the zero state and the entry may be reclaimed.
	expiresAt int64
	// state is the algorithm's state; for the sliding window log, A holds
	// the newest entry of the log, which lives in shard.logs.
	state algorithm.State
	// prev and next link the entry into its shard's LRU list (prev toward
	// the most recently used end), or next links it into the free list.
	prev, next uint32
}

// shard is one independently locked part of a store.
type shard struct {
	// mu guards every field below but order.
	mu sync.Mutex

	// index is an open-addressing table with linear probing: slot+1 of the
	// entry whose hash starts its probe sequence at hash&(len-1), or 0 for
	// an empty cell. Its length is 0 or a power of two, and it is never
	// more than 3/4 full. Deletions shift later cells back, so there are no
	// tombstones.
	index []uint32
	// chunks is the arena: slot s is chunks[s/chunkSize][s%chunkSize].
	chunks []*[chunkSize]entry
	// used is the number of slots ever handed out by the arena.
	used uint32
	// free is the first slot of the free list, linked through next.
	free uint32
	// head is the most recently used entry, tail the least.
	head, tail uint32
	// n is the number of live entries; capacity is the most it may be.
	n, capacity int
	// logs holds the logs of sliding window log keys, by slot.
	logs map[uint32][]int64

	// order is the shard's place in the store, the lock order of CheckAll.
	// It is set once by New.
	order uint32

	_ [40]byte // keep the next shard's mutex off this shard's cache lines
}

// entry returns the entry in slot; requires mu held.
func (sh *shard) entry(slot uint32) *entry {
	return &sh.chunks[slot/chunkSize][slot%chunkSize]
}

// lookup returns the slot of the entry with hash h; requires mu held.
func (sh *shard) lookup(h uint64) (uint32, bool) {
	if len(sh.index) == 0 {
		return nilSlot, false
	}
	mask := uint64(len(sh.index) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		v := sh.index[i]
		if v == 0 {
			return nilSlot, false
		}
		if sh.entry(v-1).hash == h {
			return v - 1, true
		}
	}
}

// decide decides one request against the key with hash h at the instant
// at, now being the store's instant (they differ for a request decided
// ahead of time); requires mu held.
func (sh *shard) decide(h uint64, p *algorithm.Params, now, at, cost int64) sluice.Decision {
	slot, ok := sh.lookup(h)
	if p.Algorithm == sluice.SlidingWindowLog {
		return sh.decideLog(h, slot, ok, p, now, at, cost)
	}
	var st algorithm.State
	if ok {
		st = sh.entry(slot).state
	}
	ns, d := algorithm.Apply(p, st, at, cost)
	if !ok {
		if !algorithm.Counts(p, d, cost) {
			return d // the state of a new key is unchanged: keep nothing
		}
		slot = sh.insert(h, now)
	} else {
		sh.touch(slot)
	}
	sh.setState(slot, p, ns)
	return d
}

// decideLog is decide for the sliding window log; requires mu held.
func (sh *shard) decideLog(h uint64, slot uint32, ok bool, p *algorithm.Params, now, at, cost int64) sluice.Decision {
	var log []int64
	if ok {
		log = sh.logs[slot]
	}
	nl, d := algorithm.ApplyLog(p, log, at, cost)
	if !d.Allowed || cost == 0 {
		// Keep the log as it was: the entries ApplyLog dropped from the
		// window at now still count for a clock that goes back.
		if ok {
			sh.touch(slot)
		}
		return d
	}
	if !ok {
		slot = sh.insert(h, now)
	} else {
		sh.touch(slot)
	}
	sh.setLog(slot, p, nl)
	return d
}

// setState stores st in slot; requires mu held.
func (sh *shard) setState(slot uint32, p *algorithm.Params, st algorithm.State) {
	e := sh.entry(slot)
	e.state = st
	e.expiresAt = algorithm.ExpiresAt(p, st)
}

// setLog stores log in slot; requires mu held.
func (sh *shard) setLog(slot uint32, p *algorithm.Params, log []int64) {
	if sh.logs == nil {
		sh.logs = make(map[uint32][]int64)
	}
	sh.logs[slot] = log
	var st algorithm.State
	if len(log) > 0 {
		st.A = log[len(log)-1]
	}
	e := sh.entry(slot)
	e.state = st
	if len(log) == 0 {
		e.expiresAt = 0 // an empty log is the zero state
	} else {
		e.expiresAt = algorithm.ExpiresAt(p, st)
	}
}

// insert adds an entry with hash h, which the shard must not hold, at the
// most recently used end and returns its slot. It first frees up to
// sweepMax entries expired for sweepMargin at the least recently used end,
// then evicts the least recently used entry if the shard is full. Requires
// mu held.
func (sh *shard) insert(h uint64, now int64) uint32 {
	for k := 0; k < sweepMax && sh.tail != nilSlot && sh.entry(sh.tail).expiresAt <= now-sweepMargin; k++ {
		sh.remove(sh.tail)
	}
	if sh.n >= sh.capacity && sh.tail != nilSlot {
		sh.remove(sh.tail)
	}
	var slot uint32
	if sh.free != nilSlot {
		slot = sh.free
		sh.free = sh.entry(slot).next
	} else {
		slot = sh.used
		if slot/chunkSize >= uint32(len(sh.chunks)) {
			sh.chunks = append(sh.chunks, new([chunkSize]entry))
		}
		sh.used++
	}
	if (sh.n+1)*4 > len(sh.index)*3 {
		sh.grow()
	}
	mask := uint64(len(sh.index) - 1)
	i := h & mask
	for sh.index[i] != 0 {
		i = (i + 1) & mask
	}
	sh.index[i] = slot + 1
	*sh.entry(slot) = entry{hash: h, prev: nilSlot, next: sh.head}
	if sh.head != nilSlot {
		sh.entry(sh.head).prev = slot
	} else {
		sh.tail = slot
	}
	sh.head = slot
	sh.n++
	return slot
}

// grow doubles the index; requires mu held.
func (sh *shard) grow() {
	old := sh.index
	sh.index = make([]uint32, max(16, 2*len(old)))
	mask := uint64(len(sh.index) - 1)
	for _, v := range old {
		if v == 0 {
			continue
		}
		i := sh.entry(v-1).hash & mask
		for sh.index[i] != 0 {
			i = (i + 1) & mask
		}
		sh.index[i] = v
	}
}

// touch moves slot to the most recently used end; requires mu held.
func (sh *shard) touch(slot uint32) {
	if sh.head == slot {
		return
	}
	sh.unlink(slot)
	e := sh.entry(slot)
	e.prev, e.next = nilSlot, sh.head
	sh.entry(sh.head).prev = slot // head is not nilSlot: slot was linked
	sh.head = slot
}

// unlink takes slot out of the LRU list; requires mu held.
func (sh *shard) unlink(slot uint32) {
	e := sh.entry(slot)
	if e.prev != nilSlot {
		sh.entry(e.prev).next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != nilSlot {
		sh.entry(e.next).prev = e.prev
	} else {
		sh.tail = e.prev
	}
}

// remove frees the entry in slot: out of the index, the LRU list and the
// logs, onto the free list. Requires mu held.
func (sh *shard) remove(slot uint32) {
	sh.unindex(slot)
	sh.unlink(slot)
	if len(sh.logs) > 0 {
		delete(sh.logs, slot)
	}
	e := sh.entry(slot)
	*e = entry{next: sh.free, prev: nilSlot}
	sh.free = slot
	sh.n--
}

// unindex removes slot from the index, shifting back the cells of the
// probe sequences that ran through it. Requires mu held.
func (sh *shard) unindex(slot uint32) {
	mask := uint64(len(sh.index) - 1)
	i := sh.entry(slot).hash & mask
	for sh.index[i] != slot+1 {
		i = (i + 1) & mask
	}
	for j := i; ; {
		j = (j + 1) & mask
		v := sh.index[j]
		if v == 0 {
			break
		}
		// k is where v's probe sequence starts; v may move to the hole at
		// i unless k lies cyclically in (i, j].
		k := sh.entry(v-1).hash & mask
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			sh.index[i] = v
			i = j
		}
	}
	sh.index[i] = 0
}

// clear drops everything the shard holds; requires mu held.
func (sh *shard) clear() {
	sh.index, sh.chunks, sh.logs = nil, nil, nil
	sh.used, sh.n = 0, 0
	sh.head, sh.tail, sh.free = nilSlot, nilSlot, nilSlot
}
