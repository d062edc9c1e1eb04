package redis

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
)

// maxTagLength is the longest hash tag a hashed key keeps as is; a longer
// tag is replaced by the short tag of its slot (slotTag), so the hashed key
// stays on the slot of the keys sharing the tag.
const maxTagLength = 64

// redisKey returns the Redis key of the store key k: the prefix followed by
// k, or, when that is longer than maxLen, a fixed-length form that keeps
// k's hash tag (so that a long key still lands on the slot of the other
// keys of its identity) followed by the SHA-256 of the full key:
//
//	<prefix>{<tag>}#<sha256 of prefix+k, hex>
//
// A tag over maxTagLength bytes is replaced by the short tag of its slot.
//
// Keys are binary-safe in Redis, so no other escaping is needed: two
// distinct keys map to distinct Redis keys, except that a key could be
// chosen to equal the hashed form of another (it would need a SHA-256
// preimage).
func redisKey(prefix, k string, maxLen int) string {
	if len(prefix)+len(k) <= maxLen {
		return prefix + k
	}
	full := prefix + k
	sum := sha256.Sum256([]byte(full))
	h := hex.EncodeToString(sum[:])
	tag, ok := hashTag(full)
	switch {
	case !ok:
		return prefix + "#" + h
	case len(tag) > maxTagLength:
		tag = slotTag()[crc16(tag)&16383]
	}
	return prefix + "{" + tag + "}#" + h
}

// hashTag returns the Redis Cluster hash tag of key: the bytes between the
// first '{' and the first '}' after it, when there are any.
func hashTag(key string) (string, bool) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return "", false
	}
	return key[i+1 : i+1+j], true
}

// slotOf returns the Redis Cluster slot of key.
func slotOf(key string) uint16 {
	if tag, ok := hashTag(key); ok {
		key = tag
	}
	return crc16(key) & 16383
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster maps keys to slots
// with.
func crc16(s string) uint16 {
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

// slotTag returns the table of slotTags, built on the first call.
var slotTag = sync.OnceValue(slotTags)

// slotTags returns, for each of the 16384 slots, a short string whose hash
// tag lands on that slot, so that a key (an idempotency record, a hashed
// key with a long tag) can be placed on the slot of other keys.
func slotTags() []string {
	tags := make([]string, 16384)
	left := len(tags)
	for i := 0; left > 0; i++ {
		s := strconv.Itoa(i)
		if sl := crc16(s) & 16383; tags[sl] == "" {
			tags[sl] = s
			left--
		}
	}
	return tags
}
