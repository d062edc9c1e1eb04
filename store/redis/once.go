// CheckAllOnce: all-or-nothing checks under an idempotency key, and their records.

package redis

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/keyspace"
	"github.com/sluicehq/sluice/store"
)

// CheckAllOnce is CheckAll made idempotent by key: when key has a record
// younger than ttl, nothing is decided, out is filled with the recorded
// decisions and replayed is true; otherwise reqs are decided as by CheckAll
// and their decisions recorded under key for ttl. The record is kept under
// the prefix and key (a string of the decisions); on a cluster whose batch
// lies on one slot, under "{<tag>}:" and key, where the tag places it on
// the batch's slot. On one node (a standalone server, or keys sharing a
// slot) the lookup, the decision and the record are one script call. Across slots of a cluster the key is
// first claimed (SET NX), then the batch decided, then the record written;
// a concurrent repeat waits for the record until its deadline.
func (s *Store) CheckAllOnce(ctx context.Context, key string, ttl time.Duration, reqs []store.Request, out []sluice.Decision) (replayed bool, err error) {
	if err := s.begin(reqs, out); err != nil || len(reqs) == 0 {
		return false, err
	}
	if ttl <= 0 {
		ttl = DefaultIdempotencyTTL
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	ttlMS := strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)
	if !s.cluster {
		groups := s.split(reqs, modeOnce, ttlMS)
		g := groups[0]
		g.keys = append(g.keys, redisKey(s.prefix, key, s.maxKey))
		return s.once(ctx, reqs, out, groups)
	}
	groups := s.split(reqs, modeOnce, ttlMS)
	if len(groups) == 1 {
		g := groups[0]
		g.keys = append(g.keys, redisKey(s.prefix, keyspace.OnSlot(slotOf(g.keys[0]), key), s.maxKey))
		return s.once(ctx, reqs, out, groups)
	}
	return s.onceAcross(ctx, redisKey(s.prefix, key, s.maxKey), ttlMS, reqs, out)
}

// once runs a single mode-2 script call.
func (s *Store) once(ctx context.Context, reqs []store.Request, out []sluice.Decision, groups []*group) (bool, error) {
	res, err := s.exec(ctx, groups)
	if err != nil {
		return false, err
	}
	s.fill(reqs, out, groups[0].idx, res[0])
	return res[0][1] == 1, nil
}

// pendingRecord marks an idempotency key claimed by a batch being decided.
const pendingRecord = "pending"

// onceAcross is CheckAllOnce for a batch spanning cluster slots.
func (s *Store) onceAcross(ctx context.Context, idem, ttlMS string, reqs []store.Request, out []sluice.Decision) (bool, error) {
	c := s.client
	// The claim lives as long as this call may (its deadline, plus the
	// store's timeout for the writes that end it), not the record's time
	// to live: a claim whose record could not be written (an instance that
	// died, a node that failed over or refused the write) must not hold the
	// key for minutes.
	claimMS := mustInt(ttlMS)
	if dl, ok := ctx.Deadline(); ok {
		claimMS = min(claimMS, max(1, (time.Until(dl)+s.timeout).Milliseconds()))
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		r := c.Do(ctx, c.B().Set().Key(idem).Value(pendingRecord).Nx().Get().PxMilliseconds(claimMS).Build())
		prev, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			break // claimed
		}
		wrongType := false
		if e, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(e.Error(), "WRONGTYPE") {
			// A value of another type under the key: unreadable, as
			// one-slot batches (whose script replaces it) treat it.
			wrongType, err = true, nil
		}
		if err != nil {
			return false, s.unavailable(err)
		}
		if wrongType || prev != pendingRecord {
			if vals, ok := parseRecord(prev, len(reqs)); ok && !wrongType {
				s.fill(reqs, out, seq(len(reqs)), append([]int64{0, 1}, vals...))
				return true, nil
			}
			// An unreadable record: replace it.
			if err := c.Do(ctx, c.B().Del().Key(idem).Build()).Error(); err != nil {
				return false, s.unavailable(err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return false, s.unavailable(ctx.Err())
		case <-time.After(wait):
		}
	}
	err := s.checkAll(ctx, reqs, out)
	// The claim is released, or the record written, even when the
	// caller's deadline has passed meanwhile: the batch may have been
	// charged, and a key left claimed would make every retry wait for a
	// record that never comes, until the claim's time to live. The store's
	// timeout counts from the decision, however long it took: the claim
	// lives that long past the caller's deadline.
	after, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	if err != nil {
		c.Do(after, c.B().Del().Key(idem).Build())
		return false, err
	}
	rec := formatRecord(out[:len(reqs)], reqs)
	if err := c.Do(after, c.B().Set().Key(idem).Value(rec).PxMilliseconds(mustInt(ttlMS)).Build()).Error(); err != nil {
		return false, s.unavailable(err)
	}
	return false, nil
}

// formatRecord encodes decisions as the script records them.
func formatRecord(ds []sluice.Decision, reqs []store.Request) string {
	b := make([]byte, 0, 16*len(ds))
	for i, d := range ds {
		q := reqs[i].Params.Quantum * int64(time.Microsecond)
		if i > 0 {
			b = append(b, ',')
		}
		allowed := 0
		if d.Allowed {
			allowed = 1
		}
		b = strconv.AppendInt(b, int64(allowed), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(d.Reason), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, d.Remaining, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(d.ResetAfter)/q, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(d.RetryAfter)/q, 10)
	}
	return string(b)
}

// parseRecord decodes a record of n decisions.
func parseRecord(rec string, n int) ([]int64, bool) {
	vals := make([]int64, 0, 5*n)
	start := 0
	for i := 0; i <= len(rec); i++ {
		if i == len(rec) || rec[i] == ',' {
			v, err := strconv.ParseInt(rec[start:i], 10, 64)
			if err != nil {
				return nil, false
			}
			vals = append(vals, v)
			start = i + 1
		}
	}
	return vals, len(vals) == 5*n
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func mustInt(s string) int64 {
	v, _ := strconv.ParseInt(s, 10, 64)
	return v
}
