// Long keys: the fixed-length forms of keys too long to be written in full.

package keyspace

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
)

// MaxKeyBytes is the longest key the service writes in full; longer ones
// are shortened (see Shorten). 1 KiB is some ten times the keys of ordinary
// identities and paths, so that they never change, and no key is kept
// longer than 1 KiB (or than its configured prefix and 131 bytes).
const MaxKeyBytes = 1024

// maxTagBytes is the longest hash tag a shortened key keeps as it is; a
// longer one is replaced by the short tag of its slot.
const maxTagBytes = 64

// Shorten shortens the key dst[start:] in place when it is longer than
// MaxKeyBytes, to <the key up to its hash tag>{<tag>}#<SHA-256 of the key,
// hex> (see the package comment), and returns dst. It allocates nothing.
func Shorten(dst []byte, start int) []byte {
	k := dst[start:]
	if len(k) <= MaxKeyBytes {
		return dst
	}
	sum := sha256.Sum256(k)
	tag, ok := HashTag(k)
	if !ok {
		// Not a key of this layout: all of them have a tag.
		dst = append(dst[:start], '#')
		return hex.AppendEncode(dst, sum[:])
	}
	end := start + bytes.IndexByte(k, '{') + 1 // past the tag's '{'
	if len(tag) > maxTagBytes {
		dst = append(dst[:end], SlotTag(TagSlot(tag))...)
	} else {
		dst = dst[:end+len(tag)] // the tag in place
	}
	dst = append(dst, '}', '#')
	return hex.AppendEncode(dst, sum[:])
}

// Redis returns the Redis key of the store key k: prefix followed by k,
// or, when that is longer than maxLen, a fixed-length form that keeps k's
// hash tag (so that a long key still lands on the slot of the other keys
// of its identity) followed by the SHA-256 of the full key:
//
//	<prefix>{<tag>}#<SHA-256 of prefix+k, hex>
//
// A tag over 64 bytes is replaced by the short tag of its slot, and a key
// without a tag becomes <prefix>#<SHA-256>.
//
// Keys are binary-safe in Redis, so no other escaping is needed: two
// distinct keys map to distinct Redis keys, except that a key could be
// chosen to equal the hashed form of another (it would need a SHA-256
// preimage).
func Redis(prefix, k string, maxLen int) string {
	if len(prefix)+len(k) <= maxLen {
		return prefix + k
	}
	full := prefix + k
	sum := sha256.Sum256([]byte(full))
	h := hex.EncodeToString(sum[:])
	tag, ok := HashTag(full)
	switch {
	case !ok:
		return prefix + "#" + h
	case len(tag) > maxTagBytes:
		tag = SlotTag(TagSlot(tag))
	}
	return prefix + "{" + tag + "}#" + h
}
