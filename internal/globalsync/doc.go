// Package globalsync shares the counts of global limits between regions.
//
// A rule's global limit (say 1,000 a minute) is shared by every region,
// while each region counts its own admissions in its own Redis, in fixed
// windows aligned to the epoch (a window starts at t - t mod length, so
// every region names the same windows). No check waits on another
// region: each region publishes its counts and decides from what it has
// received.
//
// # Counts
//
// Each region publishes, per key and window, its own count as its Redis
// returned it: a number that only grows within the window. Every region
// keeps, per window, a G-counter: one count per origin region, merged by
// max (State). Max is commutative, associative and idempotent, so
// redelivery, reordering and duplicates change nothing, a count that
// goes backwards is an old one and is ignored, and a healed partition
// merges without counting anything twice. The instances of one region
// all publish under the region's name: they read the same Redis counter,
// so the largest count any of them sent is the newest. A window's state
// is dropped a grace period after its end, a schedule that depends only
// on the window and so is the same in every region.
//
// # Deciding
//
// A region admits a request of global limit L while its own count, in
// its Redis, stays within its allowance (Sync.Allowance):
//
//	own < L - seen - reserve, and near the limit, own < known + (L - seen - reserve - known) / N
//
// where seen is the sum of the other regions' latest counts, reserve an
// estimate of what they have admitted since (per origin, its recent rate
// for the key times its sync lag plus one flush period, growing while the
// origin is unheard; reserve.go derives the bound), known this region's
// count as the others know it (the last one JetStream acknowledged), and
// N the regions heard from: near the limit each region takes its part of
// what is left, the remainder going to one region in turn. A region
// unheard for longer than its lag, a flush and a heartbeat is quiet, and
// counts as having taken at least its share of the limit (silence.go).
// The caller makes the test atomic in its Redis by passing the allowance
// as the per-call limit:
//
//	w := globalsync.WindowAt(key, d, now)
//	limit := sy.Allowance(w, L)
//	own, ok := <in Redis, atomically: count and admit iff own < limit>
//	sy.Observe(w, own)
//
// # Transport
//
// Counts travel over NATS JetStream, on the stream SLUICE_SYNC with one
// subject per region, sluice.sync.<region>, kept a few minutes (windows
// are short). Observe, on the check path, only records the newest count
// per window in a sharded table; a background loop sends the windows
// whose count grew every flush period (20ms by default), batched into
// compact binary messages (codec.go), published asynchronously. While
// NATS is unreachable the table keeps the newest count per window,
// bounded, and what JetStream has not acknowledged is sent again after
// reconnecting; as counts are cumulative, one later message repairs any
// number of lost ones. Each instance reads the other regions' subjects
// with a consumer of its own that starts a little in the past, so that a
// restarted instance catches up on the current windows, and that the
// server keeps through a partition, so that a healed one is read on from
// at once (consumer.go).
package globalsync
