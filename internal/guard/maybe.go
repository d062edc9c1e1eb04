package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/store"
)

// ErrMaybeCounted is wrapped, beside the reason, by the error of a call
// given up after it was sent: at its deadline, because the store stalled,
// or because its caller went away (or that the store itself gave up on at
// the end of its context, which comes at the same instant). The store may have received it and may
// count it (a paused server runs what it read once it resumes), so a check
// it failed must not be admitted without the store: the local limiter
// that Guard.Local returns refuses it. A call given up before it was sent,
// and a call the store could not be reached for (refused, reset, breaker
// open), do not wrap it: nothing was counted.
var ErrMaybeCounted = errors.New("sluice: the store may have counted the call")

// sentErr returns err, the error of a store call that was sent and
// returned, wrapping ErrMaybeCounted when the store gave up on the call at
// the end of its context (the guard's deadline, which a store that heeds
// its context may reach first, or its caller's): it may have been written
// to the store before. A connection that could not be opened (a dial
// that timed out: a host loaded beyond its cores takes long to connect
// even to a killed server) never carried it.
func sentErr(err error) error {
	if err == nil || errors.Is(err, ErrMaybeCounted) || isAnswer(err) || dialFailed(err) ||
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: %w", err, ErrMaybeCounted)
}

// dialFailed reports whether err is the failure to open a connection.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// maxMarks bounds the keys with a request the store may have counted:
// beyond it, what is given up on is not remembered (and its check may be
// admitted by the local limiter, as before).
const maxMarks = 1 << 16

// maybeCounted remembers, per key, the requests of positive cost that the
// guard gave up on after sending them, for the local limiter to refuse as
// many local decisions of the key (see Guard.Local). A mark is taken by
// the next local decision of its key, which is, but for a race with
// another check of the same key, that of the very check the guard gave up
// on: the engine decides it locally at once. A mark no local decision
// takes (its rule fails open or closed, or is a shadow rule) is forgotten
// after ttl. It is safe for concurrent use.
type maybeCounted struct {
	on  atomic.Bool  // a local limiter takes the marks: keep them
	n   atomic.Int64 // marks held, read first: no lock while there are none
	ttl time.Duration

	mu    sync.Mutex
	keys  map[string]mark // requires mu
	swept time.Time       // when expire last ran; requires mu
}

// mark is the requests of one key that the store may have counted.
type mark struct {
	n  int
	at time.Time // when the latest was given up on
}

// mark records the requests of reqs of positive cost, given up on at now
// after they were sent.
func (m *maybeCounted) mark(reqs []store.Request, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys == nil {
		m.keys = make(map[string]mark)
	}
	for i := range reqs {
		r := &reqs[i]
		if r.Cost <= 0 {
			continue
		}
		k, ok := m.keys[r.Key]
		if !ok && len(m.keys) >= maxMarks && !m.expire(now) {
			continue
		}
		k.n++
		k.at = now
		m.keys[r.Key] = k
		m.n.Add(1)
	}
}

// expire forgets the marks older than ttl at now, and reports whether
// there is room for another key. It runs once an eighth of the ttl at
// most: a flood of keys given up on does not scan the map on every one.
// It requires mu held.
func (m *maybeCounted) expire(now time.Time) bool {
	if now.Sub(m.swept) < m.ttl/8 {
		return false
	}
	m.swept = now
	for key, k := range m.keys {
		if now.Sub(k.at) >= m.ttl {
			delete(m.keys, key)
			m.n.Add(int64(-k.n))
		}
	}
	return len(m.keys) < maxMarks
}

// take takes one mark of each key of reqs (requests of positive cost)
// that has one younger than ttl at now, and reports whether it took any.
func (m *maybeCounted) take(reqs []store.Request, now time.Time) bool {
	if m.n.Load() == 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	took := false
	for i := range reqs {
		r := &reqs[i]
		k, ok := m.keys[r.Key]
		if !ok || r.Cost <= 0 {
			continue
		}
		if now.Sub(k.at) >= m.ttl {
			delete(m.keys, r.Key)
			m.n.Add(int64(-k.n))
			continue
		}
		took = true
		m.n.Add(-1)
		if k.n--; k.n == 0 {
			delete(m.keys, r.Key)
		} else {
			m.keys[r.Key] = k
		}
	}
	return took
}

// givenUp remembers the requests of a call that failed with err, when the
// store may have counted them (see Local).
func (g *Guard) givenUp(reqs []store.Request, err error) {
	if g.maybe.on.Load() && errors.Is(err, ErrMaybeCounted) {
		g.maybe.mark(reqs, g.now())
	}
}

// Local returns inner, the in-process limiter of the local failure mode
// (the engine's Config.Local), behind a gate that refuses a local
// decision of a key whose request the guard gave up on after sending it
// (see ErrMaybeCounted): the store may count that request, and a check
// admitted both by the store and by the local limiter would pass the
// limit. The refusal is an error, on which the engine fails the check
// closed. A call the store could not be reached for (refused, reset, an
// open breaker, a stalled store's calls that fail at once) or given up
// before it was sent is decided by inner as before. One local decision of
// the key is refused per request given up on, within the guard's deadline
// of it. The gate is safe for concurrent use; Local may be called once.
func (g *Guard) Local(inner Store) Store {
	g.maybe.on.Store(true)
	return &localGate{m: &g.maybe, now: g.now, inner: inner}
}

// localGate is the local limiter behind the guard's gate (see Local).
type localGate struct {
	m     *maybeCounted
	now   func() time.Time
	inner Store
}

// Do implements store.Store: it decides b by the inner limiter, unless a
// request of b is of a key the store may have counted a request of.
func (l *localGate) Do(ctx context.Context, b *store.Batch) error {
	if l.m.take(b.Reqs, l.now()) {
		return fmt.Errorf("guard: local limiter: %w", ErrMaybeCounted)
	}
	return l.inner.Do(ctx, b)
}

// Info implements store.Store: that of the inner limiter.
func (l *localGate) Info() store.Info { return l.inner.Info() }

// Reset implements store.Store: it resets the keys in the inner limiter.
func (l *localGate) Reset(ctx context.Context, keys ...string) error {
	return l.inner.Reset(ctx, keys...)
}
