package redis

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/sluicehq/sluice/internal/keyslot"
)

// maxTagLength is the longest hash tag a hashed key keeps as is; a longer
// tag is replaced by the short tag of its slot (keyslot.Tag), so the hashed key
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
		tag = keyslot.Tag(keyslot.TagSlot(tag))
	}
	return prefix + "{" + tag + "}#" + h
}

// hashTag returns the Redis Cluster hash tag of key (see keyslot.HashTag).
func hashTag(key string) (string, bool) { return keyslot.HashTag(key) }

// slotOf returns the Redis Cluster slot of key.
func slotOf(key string) uint16 { return keyslot.Of(key) }
