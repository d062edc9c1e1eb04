// Package keyspace owns the names Sluice gives the state it keeps in a
// store: how a key is built from a rule or an Envoy descriptor, which part
// of it is the Redis Cluster hash tag, how a key too long is shortened, and
// how the Redis store places a key under its prefix. Every other package
// builds and reads keys through it, so this comment is the one description
// of the layout.
//
// The layout is a contract with the state already in Redis: an upgrade
// that wrote other bytes for the same limit would start every count
// afresh. A change of layout is made on purpose, through the layout tag
// below, never by accident.
//
// # Limits of rules
//
// A rule's key is
//
//	rl:<rule id>:<tag>:{<dimension>=<value>}[:<dimension>=<value>...]
//
// for instance rl:orders-per-user:tb.1m0s:{user=42}:endpoint=/api/v1/orders.
// The rule id is written as it is (ids are letters, digits, '_', '-' and
// '.'). The first dimension's value is wrapped in braces, a Redis Cluster
// hash tag: every key of one identity (all the rules counting by
// client=acme, say) lands on one slot. A rule counting by the global
// dimension has the identity {global}. Values are escaped (AppendEscaped)
// so that ':', '{', '}', '%' and control bytes in them cannot make two
// identities collide: each becomes %XX. The policy writes each value in one
// spelling (an endpoint as rules match it, with a leading '/'; a method upper
// case; an IP address in its canonical form).
//
// # The layout tag
//
// <tag> versions the state: it names the layout of the state (algorithm,
// window, quantum; see LayoutTag), such as tb.1m0s, fw.1s or
// swc.24h0m0s.q10, so that a change of algorithm or window in the
// configuration starts from fresh state, while a change of limit (a new
// tier, an override, a priority) keeps counting on the same state. The
// encoding of the value under a key is not in the tag: a store that
// changes it (the Redis store's fixed window went from a 25-byte string
// to a hash of its window's count) reads the earlier encoding too, so
// that counts survive an upgrade on the same keys. A global
// limit, shared by every region, has the tag @g (GlobalTag) whatever its
// window: no layout tag can be it.
//
// # Envoy descriptors
//
// An Envoy descriptor's key is
//
//	rl:envoy:<domain>:<tag>:{<key>=<value>:<key>=<value>...}
//
// (the domain escaped as a value; a '=' in a <key> is written %3D), so that
// every distinct value of a descriptor entry has its own counter, as in
// envoyproxy/ratelimit; all the entries are the hash tag. A descriptor's
// limit override counts on
//
//	rl:envoy:<domain>:override.<tag>:{<key>=<value>...}
//
// apart from the configured limit of the same entries, and a descriptor's
// global limit on rl:envoy:<domain>:@g:{...}.
//
// # Long keys
//
// A key longer than MaxKeyBytes (a long resource, an Envoy descriptor of
// many long entries) is shortened to
//
//	<the key up to its hash tag>{<tag>}#<SHA-256 of the whole key, hex>
//
// which is at most 131 bytes past the rule's or limit's prefix, so that
// what is kept per key in process (the over-limit cache, hot keys, burst
// counts, events) and in the store is bounded whatever the input. <tag> is
// the key's hash tag when it is at most 64 bytes long, else the short tag
// of its Redis Cluster slot (SlotTag): the key stays on the slot of its
// identity's other keys, long or short. Keys are escaped and end with '}'
// or a value, so no key written in full ends with '}#' and 64 hex digits: a
// shortened key is never another key's, and two keys share a shortened form
// only if their SHA-256 collide. The form depends on the key alone, so every
// instance and every restart computes it alike.
//
// # Keys of the service itself
//
//	rl:idem:{<client>}:<idempotency key>:<counters, 16 hex digits>
//
// holds the decisions of an idempotent check where the store keeps them for
// every instance (see Idempotency); in it only ':', '{', '}' and '%' are
// escaped. rl:_ready is the key the readiness probe charges, and
// rl:_warm:{<n>} (n from 0 to 31) the keys read to open the connections to
// every node at start.
//
// # In Redis
//
// The Redis store writes the state of a key under <prefix><key> (see
// Redis), where the prefix (empty by default) lets deployments share one
// Redis; a key longer than the store's maximum is written
// <prefix>{<tag>}#<SHA-256 of prefix and key, hex>, with the tag kept as
// above. On a cluster, the idempotency record of a batch on one slot is
// <prefix>{<slot tag>}:<key> (OnSlot). A pool of reservations, whose
// handle is 16 hex digits, is three keys with the handle as hash tag,
// <prefix>rsv:{<handle>}:p, :g and :x (PoolKeys), listed in
// <prefix>rsv:pools (PoolRegistry).
package keyspace
