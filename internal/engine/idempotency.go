package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"time"
)

// idemCache remembers the decision of each idempotency key, scoped by
// client and by the counters of the check (see counters), for a TTL. It
// lives in process: it makes a retried check charge once on one instance.
// Concurrent checks with one key wait for the first. A record keeps a hash
// of its client, key and counters (see newIdemKey), not the strings.
//
// Expired records are swept as the map grows, and by a background
// goroutine every tenth of the TTL, started with the first record and
// stopped by close, so that records expire whether or not new keys
// arrive; a sweep that drops most of the map moves the rest into a new
// one, for a Go map never gives back the memory of deleted entries.
type idemCache struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu sync.Mutex
	// m, nextSweep, swept, peak and closed are guarded by mu.
	m         map[idemKey]*idemEntry
	nextSweep int       // the size at which m is swept next
	swept     time.Time // when m was last swept
	peak      int       // the most records m held since it was made
	closed    bool

	start sync.Once
	stop  chan struct{}
	wg    sync.WaitGroup
}

// idemKey identifies a record: the first 16 bytes of the SHA-256 of the
// client id and the idempotency key, each prefixed by its length, and the
// hash of the check's counters (see counters). Two records share a key
// only if SHA-256 collides on those 128 bits: finding any two ids that do
// takes some 2^64 hashes, and those would be the finder's own; answering
// another client's request with a record would take one that collides
// with that client's (a second preimage), some 2^128.
type idemKey [16]byte

// newIdemKey returns the key of the record of client's idempotency key on
// the counters hashed as counters.
func newIdemKey(client, key string, counters uint64) idemKey {
	// Identifiers are at most MaxIdentifierLen bytes: the buffer stays on
	// the stack.
	buf := make([]byte, 0, 4+MaxIdentifierLen+4+MaxIdentifierLen+8)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(client)))
	buf = append(buf, client...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(key)))
	buf = append(buf, key...)
	buf = binary.BigEndian.AppendUint64(buf, counters)
	sum := sha256.Sum256(buf)
	return idemKey(sum[:16])
}

type idemEntry struct {
	done    chan struct{} // while being decided; closed and dropped when res is set
	res     Result
	expires time.Time
}

func newIdemCache(ttl time.Duration, max int, now func() time.Time) *idemCache {
	return &idemCache{ttl: ttl, max: max, now: now, m: map[idemKey]*idemEntry{}, nextSweep: 1024, stop: make(chan struct{})}
}

// sweepLoop sweeps the expired records every tenth of the TTL (100 ms at
// least) until close.
func (c *idemCache) sweepLoop() {
	defer c.wg.Done()
	t := time.NewTicker(max(c.ttl/10, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.mu.Lock()
			c.sweep(c.now())
			c.mu.Unlock()
		}
	}
}

// close stops the background sweep and waits for it. Calling it again
// does nothing.
func (c *idemCache) close() {
	c.mu.Lock()
	closed := c.closed
	c.closed = true
	c.mu.Unlock()
	if !closed {
		close(c.stop)
		c.wg.Wait()
	}
}

// do returns the remembered decision of k at now, or runs
// decide, remembers its result and returns it. An error from decide is
// returned and not remembered, and so is a result decided by a failure
// mode: the store did not answer and charged nothing, so a retry is
// decided anew.
func (c *idemCache) do(ctx context.Context, now time.Time, k idemKey, decide func() (Result, error)) (Result, error) {
	for {
		c.mu.Lock()
		e := c.m[k]
		if e != nil && e.expires.IsZero() {
			// Being decided by another caller: wait for it.
			done := e.done
			c.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				return Result{}, ctx.Err()
			}
		}
		if e != nil && now.Before(e.expires) {
			c.mu.Unlock()
			return replay(e.res), nil
		}
		if e != nil {
			delete(c.m, k)
		}
		// Sweep as m doubles, and at the bound at most every tenth of
		// the TTL: a full map of live records is not swept on every
		// check, and one whose records have expired frees its room.
		if len(c.m) >= c.nextSweep || len(c.m) >= c.max && !now.Before(c.swept.Add(c.ttl/10)) {
			c.sweep(now)
		}
		if len(c.m) >= c.max {
			c.mu.Unlock()
			return decide()
		}
		e = &idemEntry{done: make(chan struct{})}
		c.m[k] = e
		c.peak = max(c.peak, len(c.m))
		if !c.closed {
			c.start.Do(func() {
				c.wg.Add(1)
				go c.sweepLoop()
			})
		}
		c.mu.Unlock()

		res, err := decide()
		c.mu.Lock()
		if err != nil || fellBack(&res) {
			delete(c.m, k)
		} else {
			e.res = res
			e.expires = now.Add(c.ttl)
		}
		close(e.done)
		e.done = nil // a kept record does not keep its channel
		c.mu.Unlock()
		return res, err
	}
}

// fellBack reports whether a rule's failure mode decided r, the store
// having failed.
func fellBack(r *Result) bool {
	switch r.Source {
	case SourceFailOpen, SourceFailClosed, SourceLocal:
		return true
	}
	return false
}

// sweep drops expired entries; requires mu held. When the records left
// are under a quarter of the most m held (and that was more than 1024),
// they move into a new map, so that the memory of the others is freed.
func (c *idemCache) sweep(now time.Time) {
	for k, e := range c.m {
		if !e.expires.IsZero() && !now.Before(e.expires) {
			delete(c.m, k)
		}
	}
	if c.peak > 1024 && len(c.m) < c.peak/4 {
		m := make(map[idemKey]*idemEntry, len(c.m))
		for k, e := range c.m {
			m[k] = e
		}
		c.m, c.peak = m, len(m)
	}
	c.nextSweep = max(2*len(c.m), 1024)
	c.swept = now
}

// replay returns a copy of the first decision marked as a repeat: it
// charged nothing this time, and the enforcing rules the store decided
// are decided by the first decision (SourceIdempotent), as a store that
// keeps the records reports them.
func replay(r Result) Result {
	out := r
	out.Rules = make([]RuleResult, len(r.Rules))
	for i, rr := range r.Rules {
		replayRule(&rr)
		out.Rules[i] = rr
	}
	replayRule(&out.Deciding)
	out.Source = SourceIdempotent
	return out
}

func replayRule(rr *RuleResult) {
	rr.Cost = 0
	if !rr.Shadow && rr.Source != SourceAllowList && rr.Source != SourceDenyList && rr.Source != SourceNoRule {
		rr.Source = SourceIdempotent
	}
}
