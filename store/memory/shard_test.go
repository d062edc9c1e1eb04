package memory

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

func TestEntrySize(t *testing.T) {
	if got, want := unsafe.Sizeof(entry{}), uintptr(48); got != want {
		t.Errorf("sizeof(entry) = %d, want %d", got, want)
	}
}

// newShard returns an empty shard holding at most capacity entries.
func newShard(capacity int) *shard {
	return &shard{capacity: capacity, head: nilSlot, tail: nilSlot, free: nilSlot}
}

// checkShard verifies the invariants of sh against want, the hashes it
// should hold from most to least recently used.
func checkShard(t *testing.T, sh *shard, want []uint64) {
	t.Helper()
	if sh.n != len(want) {
		t.Fatalf("n = %d, want %d", sh.n, len(want))
	}
	inIndex := 0
	for _, v := range sh.index {
		if v != 0 {
			inIndex++
		}
	}
	if inIndex != len(want) {
		t.Fatalf("index holds %d entries, want %d", inIndex, len(want))
	}
	var got []uint64
	prev := nilSlot
	for s := sh.head; s != nilSlot; s = sh.entry(s).next {
		if sh.entry(s).prev != prev {
			t.Fatalf("slot %d: prev = %d, want %d", s, sh.entry(s).prev, prev)
		}
		got = append(got, sh.entry(s).hash)
		prev = s
	}
	if sh.tail != prev {
		t.Fatalf("tail = %d, want %d", sh.tail, prev)
	}
	if len(got) != len(want) {
		t.Fatalf("LRU list has %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("LRU list[%d] = %#x, want %#x", i, got[i], want[i])
		}
		if _, ok := sh.lookup(want[i]); !ok {
			t.Fatalf("lookup(%#x) failed", want[i])
		}
	}
}

// TestShardRandomOps drives a shard with random inserts, touches and
// removals, including hashes that collide in the index, and compares it
// with a plain model after every step.
func TestShardRandomOps(t *testing.T) {
	const capacity = 200
	rng := rand.New(rand.NewPCG(1, 2))
	sh := newShard(capacity)
	var model []uint64 // most recently used first
	find := func(h uint64) int {
		for i, x := range model {
			if x == h {
				return i
			}
		}
		return -1
	}
	for step := 0; step < 20_000; step++ {
		// Few distinct low bits so probe sequences overlap and wrap.
		h := rng.Uint64N(64)<<32 | rng.Uint64N(300)
		i := find(h)
		switch op := rng.IntN(3); {
		case op < 2 && i < 0:
			sh.insert(h, 0)
			sh.entry(mustLookup(t, sh, h)).expiresAt = 1 << 62
			if len(model) == capacity {
				model = model[:len(model)-1]
			}
			model = append([]uint64{h}, model...)
		case op < 2:
			sh.touch(mustLookup(t, sh, h))
			model = append(append([]uint64{h}, model[:i]...), model[i+1:]...)
		case i >= 0:
			sh.remove(mustLookup(t, sh, h))
			model = append(model[:i], model[i+1:]...)
		}
		checkShard(t, sh, model)
	}
	if sh.used > capacity {
		t.Errorf("arena handed out %d slots for a capacity of %d", sh.used, capacity)
	}
}

func mustLookup(t *testing.T, sh *shard, h uint64) uint32 {
	t.Helper()
	s, ok := sh.lookup(h)
	if !ok {
		t.Fatalf("lookup(%#x) failed", h)
	}
	return s
}

// TestShardReclaimsExpired checks that an insertion frees entries expired
// for sweepMargin at the least recently used end, and only those.
func TestShardReclaimsExpired(t *testing.T) {
	sh := newShard(100)
	for h := uint64(1); h <= 10; h++ {
		sh.entry(sh.insert(h, 0)).expiresAt = int64(h * 10)
	}
	// At 35 the entries 1, 2 and 3 have expired, but not for sweepMargin:
	// a check at an instant a little earlier may still need them.
	sh.insert(11, 35)
	checkShard(t, sh, []uint64{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1})
	// At 35 + sweepMargin they have; an insertion frees at most sweepMax
	// of them.
	sh.entry(mustLookup(t, sh, 11)).expiresAt = 1000 + sweepMargin
	sh.insert(12, 35+sweepMargin)
	checkShard(t, sh, []uint64{12, 11, 10, 9, 8, 7, 6, 5, 4, 3})
	sh.entry(mustLookup(t, sh, 12)).expiresAt = 1000 + sweepMargin
	sh.insert(13, 35+sweepMargin)
	checkShard(t, sh, []uint64{13, 12, 11, 10, 9, 8, 7, 6, 5, 4})
	if sh.used != 11 {
		t.Errorf("arena handed out %d slots, want 11 (freed slots reused)", sh.used)
	}
}
