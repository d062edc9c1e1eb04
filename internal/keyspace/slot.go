// Redis Cluster hash slots and hash tags: what keeps the keys of one
// identity on one slot.

package keyspace

import (
	"strconv"
	"sync"
)

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// HashTag returns the hash tag of key, as Redis Cluster reads it: the bytes
// between the first '{' and the first '}' after it, when there are any.
// ok is false when key has no hash tag (no '{', no '}' after it, or nothing
// between them): its slot is then that of the whole key.
func HashTag[S ~string | ~[]byte](key S) (tag S, ok bool) {
	i := indexByte(key, '{')
	if i < 0 {
		return key[:0], false
	}
	j := indexByte(key[i+1:], '}')
	if j <= 0 {
		return key[:0], false
	}
	return key[i+1 : i+1+j], true
}

func indexByte[S ~string | ~[]byte](s S, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// Slot returns the Redis Cluster slot of key.
func Slot(key string) uint16 {
	if tag, ok := HashTag(key); ok {
		return TagSlot(tag)
	}
	return TagSlot(key)
}

// TagSlot returns the slot of the keys whose hash tag is tag (and of the
// key tag when it has no hash tag of its own).
func TagSlot[S ~string | ~[]byte](tag S) uint16 {
	return crc16(tag) & (Slots - 1)
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster maps keys to slots
// with.
func crc16[S ~string | ~[]byte](s S) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// SlotTag returns a short string (the decimal digits of the smallest number
// on the slot) whose hash tag lands on slot, so that a key can be placed on
// the slot of other keys: "{" + SlotTag(s) + "}" is on slot s. slot must be
// below Slots. The table is built on the first call.
func SlotTag(slot uint16) string { return tags()[slot] }

var tags = sync.OnceValue(func() []string {
	t := make([]string, Slots)
	left := len(t)
	for i := 0; left > 0; i++ {
		s := strconv.Itoa(i)
		if sl := TagSlot(s); t[sl] == "" {
			t[sl] = s
			left--
		}
	}
	return t
})
