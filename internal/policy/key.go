package policy

import (
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice/internal/keyspace"
)

// Store keys. Their layout is package keyspace's (see its documentation):
// this file writes the values of a check in the one spelling the rules
// match them in.

// MaxKeyBytes is the longest store key written in full; longer ones are
// shortened (see keyspace.Shorten).
const MaxKeyBytes = keyspace.MaxKeyBytes

// AppendKey appends the store key of r under l for q to dst and returns
// the extended slice; ok is false when q lacks a value the rule's dimension
// needs (a per-user rule and a check without user), in which case the rule
// does not apply. A key longer than MaxKeyBytes is shortened.
func (r *Rule) AppendKey(dst []byte, l *Limit, q *Request) (_ []byte, ok bool) {
	return r.appendKey(dst, l.Tag, q)
}

// AppendGlobalKey appends the store key of r's global limit for q to dst,
// as AppendKey does for a limit. The key is the same in every region, and
// hashes to the slot of the rule's other keys for q.
func (r *Rule) AppendGlobalKey(dst []byte, q *Request) (_ []byte, ok bool) {
	return r.appendKey(dst, keyspace.GlobalTag, q)
}

func (r *Rule) appendKey(dst []byte, tag string, q *Request) (_ []byte, ok bool) {
	start := len(dst)
	dst = append(dst, r.keyPrefix...)
	dst = append(dst, tag...)
	dst = append(dst, ':')
	for i, d := range r.Dimension {
		if d == DimGlobal {
			dst = append(dst, keyspace.GlobalIdentity...)
			continue
		}
		v := q.value(d)
		if v == "" {
			return dst, false
		}
		dst = keyspace.AppendDimension(dst, i, dimensionNames[d])
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
			dst = keyspace.AppendEscaped(dst, v)
		}
		if i == 0 {
			dst = keyspace.CloseHashTag(dst)
		}
	}
	return keyspace.Shorten(dst, start), true
}

// appendUpper appends s upper-cased, escaped as keyspace.AppendEscaped does. It
// allocates only for a value beyond ASCII.
func appendUpper(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			s = strings.ToUpper(s)
			break
		}
	}
	start := len(dst)
	dst = keyspace.AppendEscaped(dst, s)
	for i := start; i < len(dst); i++ {
		if c := dst[i]; c >= 'a' && c <= 'z' {
			dst[i] = c - 'a' + 'A'
		}
	}
	return dst
}

// appendIP appends the address s, escaped as keyspace.AppendEscaped does, in one
// spelling per address, as the allow and deny lists match it: an IPv6
// address in its canonical form without its zone (which the caller may
// spell at will: "2001:db8::1%1", "%2", ... are one address), an
// IPv4-mapped one as IPv4. A dotted IPv4 address is canonical when it is
// valid, and what is not an address is appended as it is. It does not
// allocate.
func appendIP(dst []byte, s string) []byte {
	if strings.IndexByte(s, ':') < 0 {
		return keyspace.AppendEscaped(dst, s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return keyspace.AppendEscaped(dst, s)
	}
	a = a.WithZone("").Unmap()
	var buf [64]byte
	return keyspace.AppendEscaped(dst, a.AppendTo(buf[:0]))
}
