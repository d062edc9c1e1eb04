package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice/internal/keyslot"
)

// Store keys.
//
// A rule's key is
//
//	rl:<rule id>:<tag>:{<dimension>=<value>}[:<dimension>=<value>...]
//
// for instance rl:orders-per-user:tb.1m0s:{user=42}:endpoint=/api/v1/orders.
// The tag names the state layout (algorithm, window, quantum) so that a
// change of algorithm or window in the configuration starts from fresh
// state, while a change of limit (a new tier, an override, a priority)
// keeps counting on the same state: a rule's limits of one algorithm and
// window count at one quantum (see shareQuanta). The first dimension's value is
// wrapped in braces, a Redis Cluster hash tag: every key of one identity
// (all the rules counting by client=acme, say) lands on one slot.
// The endpoint is the resource as rules match it (resourcePath), with a
// leading '/'.
// Values are escaped so that ':', '{', '}' and '%' in them cannot make two
// identities collide: each becomes %XX.
//
// An Envoy descriptor's key is
//
//	rl:envoy:<domain>:<tag>:{<key>=<value>:<key>=<value>...}
//
// (a '=' in a <key> is written %3D)
//
// so that every distinct value of a descriptor entry has its own counter,
// as in envoyproxy/ratelimit. A descriptor's limit override counts on
//
//	rl:envoy:<domain>:override.<tag>:{<key>=<value>...}
//
// apart from the configured limit of the same entries.
//
// A key longer than MaxKeyBytes (a long resource, an Envoy descriptor of
// many long entries) is shortened to
//
//	<the key up to its hash tag>{<tag>}#<SHA-256 of the whole key, hex>
//
// which is at most 131 bytes past the rule's or limit's prefix, so that
// what is kept per key in process (the over-limit cache, hot keys, burst
// counts, events) and in the store is bounded whatever the input. <tag> is
// the key's hash tag when it is at most maxTagBytes long, else the short
// tag of its Redis Cluster slot (keyslot.Tag): the key stays on the slot
// of its identity's other keys, long or short. Keys are escaped and end
// with '}' or a value, so no key written in full ends with '}#' and 64 hex
// digits: a shortened key is never another key's, and two keys share a
// shortened form only if their SHA-256 collide. The form depends on the
// key alone, so every instance and every restart computes it alike.

// MaxKeyBytes is the longest store key written in full; longer ones are
// shortened (see AppendKey). 1 KiB is some ten times the keys of ordinary
// identities and paths, so that they never change, and no key is kept
// longer than 1 KiB (or than its configured prefix and 131 bytes).
const MaxKeyBytes = 1024

// maxTagBytes is the longest hash tag a shortened key keeps as it is, as
// the Redis store keeps the tags of the keys it hashes.
const maxTagBytes = 64

// shorten shortens the key dst[start:] when it is longer than MaxKeyBytes
// (see AppendKey) and returns dst. It allocates nothing.
func shorten(dst []byte, start int) []byte {
	k := dst[start:]
	if len(k) <= MaxKeyBytes {
		return dst
	}
	sum := sha256.Sum256(k)
	tag, ok := keyslot.HashTag(k)
	if !ok {
		// Not a key this package writes: all of them have a tag.
		dst = append(dst[:start], '#')
		return hex.AppendEncode(dst, sum[:])
	}
	end := start + bytes.IndexByte(k, '{') + 1 // past the tag's '{'
	if len(tag) > maxTagBytes {
		dst = append(dst[:end], keyslot.Tag(keyslot.TagSlot(tag))...)
	} else {
		dst = dst[:end+len(tag)] // the tag in place
	}
	dst = append(dst, '}', '#')
	return hex.AppendEncode(dst, sum[:])
}

// AppendKey appends the store key of r under l for q to dst and returns
// the extended slice; ok is false when q lacks a value the rule's dimension
// needs (a per-user rule and a check without user), in which case the rule
// does not apply. A key longer than MaxKeyBytes is shortened.
func (r *Rule) AppendKey(dst []byte, l *Limit, q *Request) (_ []byte, ok bool) {
	return r.appendKey(dst, l.Tag, q)
}

// globalTag stands for the limit's tag in the keys of global limits: one
// key per identity whatever its tier, and no tier's tag (letters, digits,
// '_', '-', '.') can be it.
const globalTag = "@g"

// AppendGlobalKey appends the store key of r's global limit for q to dst,
// as AppendKey does for a limit. The key is the same in every region, and
// hashes to the slot of the rule's other keys for q.
func (r *Rule) AppendGlobalKey(dst []byte, q *Request) (_ []byte, ok bool) {
	return r.appendKey(dst, globalTag, q)
}

func (r *Rule) appendKey(dst []byte, tag string, q *Request) (_ []byte, ok bool) {
	start := len(dst)
	dst = append(dst, r.keyPrefix...)
	dst = append(dst, tag...)
	dst = append(dst, ':')
	for i, d := range r.Dimension {
		if d == DimGlobal {
			dst = append(dst, "{global}"...)
			continue
		}
		v := q.value(d)
		if v == "" {
			return dst, false
		}
		if i == 0 {
			dst = append(dst, '{')
		} else {
			dst = append(dst, ':')
		}
		dst = append(dst, dimensionNames[d]...)
		dst = append(dst, '=')
		if d == DimEndpoint {
			// The resource as rules match it, so that its spellings
			// ("/a/", "/a//b", "/a?x") count as one.
			v, _ = resourcePath(v, true)
			dst = append(dst, '/')
		}
		switch d {
		case DimMethod:
			// Methods match case-insensitively: "post" is POST's.
			dst = appendUpper(dst, v)
		case DimIP:
			dst = appendIP(dst, v)
		default:
			dst = appendEscaped(dst, v)
		}
		if i == 0 {
			dst = append(dst, '}')
		}
	}
	return shorten(dst, start), true
}

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends s with ':', '{', '}', '%' and control bytes
// written as %XX.
func appendEscaped[S ~string | ~[]byte](dst []byte, s S) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ':' || c == '{' || c == '}' || c == '%' || c < 0x20 || c == 0x7f:
			dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// appendUpper appends s upper-cased, escaped as appendEscaped does. It
// allocates only for a value beyond ASCII.
func appendUpper(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			s = strings.ToUpper(s)
			break
		}
	}
	start := len(dst)
	dst = appendEscaped(dst, s)
	for i := start; i < len(dst); i++ {
		if c := dst[i]; c >= 'a' && c <= 'z' {
			dst[i] = c - 'a' + 'A'
		}
	}
	return dst
}

// appendIP appends the address s, escaped as appendEscaped does, in one
// spelling per address, as the allow and deny lists match it: an IPv6
// address in its canonical form without its zone (which the caller may
// spell at will: "2001:db8::1%1", "%2", ... are one address), an
// IPv4-mapped one as IPv4. A dotted IPv4 address is canonical when it is
// valid, and what is not an address is appended as it is. It does not
// allocate.
func appendIP(dst []byte, s string) []byte {
	if strings.IndexByte(s, ':') < 0 {
		return appendEscaped(dst, s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return appendEscaped(dst, s)
	}
	a = a.WithZone("").Unmap()
	var buf [64]byte
	return appendEscaped(dst, a.AppendTo(buf[:0]))
}
