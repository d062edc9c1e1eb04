package keyspace

import (
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

const (
	// GlobalTag stands for the layout tag in the keys of global limits:
	// one key per identity whatever its tier or window, and no layout
	// tag (letters, digits, '_', '-', '.') can be it.
	GlobalTag = "@g"
	// GlobalIdentity is the identity part of the keys of rules counting
	// by the global dimension: every check shares it.
	GlobalIdentity = "{global}"
	// ReadyKey is the key the readiness probe charges.
	ReadyKey = "rl:_ready"
)

// algorithmAbbrev names the algorithms in layout tags.
var algorithmAbbrev = map[sluice.Algorithm]string{
	sluice.TokenBucket:          "tb",
	sluice.LeakyBucket:          "lb",
	sluice.FixedWindow:          "fw",
	sluice.SlidingWindowLog:     "swl",
	sluice.SlidingWindowCounter: "swc",
	sluice.GCRA:                 "gcra",
}

// LayoutTag returns the layout tag of the state of algorithm alg over
// window (a time.Duration's String, such as "1m0s") counted in quanta of
// quantum microseconds: "tb.1m0s", or "tb.24h0m0s.q10" when quantum is not 1.
func LayoutTag(alg sluice.Algorithm, window string, quantum int64) string {
	tag := algorithmAbbrev[alg] + "." + window
	if quantum != 1 {
		tag += ".q" + strconv.FormatInt(quantum, 10)
	}
	return tag
}

// RulePrefix returns the start of every key of the rule id: "rl:<id>:",
// followed by a layout tag, ':' and the identity.
func RulePrefix(id string) string { return "rl:" + id + ":" }

// AppendDimension appends the name of a rule key's i-th dimension (from 0)
// and its '=' to dst: "{name=" for the first, whose value is the key's hash
// tag, ":name=" for the others. The value follows, escaped, and then, after
// the first, CloseHashTag.
func AppendDimension(dst []byte, i int, name string) []byte {
	if i == 0 {
		dst = append(dst, '{')
	} else {
		dst = append(dst, ':')
	}
	dst = append(dst, name...)
	return append(dst, '=')
}

// CloseHashTag appends the '}' that ends a key's hash tag.
func CloseHashTag(dst []byte) []byte { return append(dst, '}') }

// EnvoyPrefix returns the start of the keys of an Envoy descriptor's limit
// in domain, whose layout tag is tag (GlobalTag for its global limit):
// "rl:envoy:<domain>:<tag>:".
func EnvoyPrefix(domain, tag string) string {
	return "rl:envoy:" + string(AppendEscaped(nil, domain)) + ":" + tag + ":"
}

// EnvoyOverridePrefix returns the start of the keys of a descriptor's limit
// override in domain, counted with the layout tag tag:
// "rl:envoy:<domain>:override.<tag>:".
func EnvoyOverridePrefix(domain, tag string) string {
	return EnvoyPrefix(domain, "override."+tag)
}

// AppendEnvoyEntry appends the i-th entry (from 0) of a descriptor's key to
// dst: '{' before the first, ':' before the others, then key=value. A '='
// in key is written %3D, so that {a=b=c} cannot be the key of both
// {a: "b=c"} and {"a=b": "c"}. The last entry is followed by CloseHashTag.
func AppendEnvoyEntry(dst []byte, i int, key, value string) []byte {
	if i == 0 {
		dst = append(dst, '{')
	} else {
		dst = append(dst, ':')
	}
	for {
		before, after, found := strings.Cut(key, "=")
		dst = AppendEscaped(dst, before)
		if !found {
			break
		}
		dst, key = append(dst, "%3D"...), after
	}
	dst = append(dst, '=')
	return AppendEscaped(dst, value)
}

const hexDigits = "0123456789ABCDEF"

// AppendEscaped appends s to dst with ':', '{', '}', '%' and control bytes
// written as %XX, as the values in keys are.
func AppendEscaped[S ~string | ~[]byte](dst []byte, s S) []byte {
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

// Idempotency returns the key of the idempotency record of the check of
// client with the idempotency key key on the counters whose hash is
// counters: "rl:idem:{<client>}:<key>:<counters as 16 hex digits>". The
// client is its hash tag.
func Idempotency(client, key string, counters uint64) string {
	var hex [16]byte
	for i := range hex {
		hex[i] = "0123456789abcdef"[counters>>(60-4*i)&15]
	}
	return "rl:idem:{" + escapeIdem(client) + "}:" + escapeIdem(key) + ":" + string(hex[:])
}

// escapeIdem writes ':', '{', '}' and '%' of s as %XX, and leaves control
// bytes as they are (as the idempotency keys always have).
func escapeIdem(s string) string {
	if !strings.ContainsAny(s, ":{}%") {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for j := 0; j < len(s); j++ {
		switch c := s[j]; c {
		case ':', '{', '}', '%':
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// WarmKey returns the n-th key read to open the connections at start:
// "rl:_warm:{<n>}", on a slot of its own for each n.
func WarmKey(n int) string { return "rl:_warm:{" + strconv.Itoa(n) + "}" }

// OnSlot returns the name of key placed on slot by a hash tag of its own:
// "{<SlotTag(slot)>}:<key>".
func OnSlot(slot uint16, key string) string { return "{" + SlotTag(slot) + "}:" + key }

// PoolKeys returns the Redis keys of the pool of reservations whose handle
// is handle, under prefix: the pool's hash, its granted reservations and
// their expiries, with the handle as hash tag.
func PoolKeys(prefix, handle string) []string {
	base := prefix + "rsv:{" + handle + "}:"
	return []string{base + "p", base + "g", base + "x"}
}

// PoolRegistry returns the Redis key, under prefix, of the sorted set of
// the pools of reservations.
func PoolRegistry(prefix string) string { return prefix + "rsv:pools" }
