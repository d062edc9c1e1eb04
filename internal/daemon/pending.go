// A Redis store that does not answer when the daemon starts: the daemon
// serves anyway, decides by the rules' failure modes and reports not ready
// until the store connects, in the background.

package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/internal/reserve/redispool"
	"github.com/sluicehq/sluice/reservation"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// errStorePending is the error of every call to a Redis store that has not
// connected yet. It wraps sluice.ErrStoreUnavailable, so that the guard
// decides by the rules' failure modes and the APIs answer 503 where a
// check cannot be decided.
var errStorePending = fmt.Errorf("%w: not connected yet", sluice.ErrStoreUnavailable)

// Pauses between two attempts of a pending store to connect: the first,
// doubled after each failure up to the last. A refused connection costs
// one TCP handshake, so the store tries often, and a Redis that comes up
// is used within half a second.
const (
	firstConnectPause = 50 * time.Millisecond
	maxConnectPause   = 500 * time.Millisecond
)

// pendingLogEvery is how often a pending store logs that it still cannot
// connect, after the first failure's warning.
const pendingLogEvery = 30 * time.Second

// pendingRedis is a Redis store that could not connect when the daemon
// started. A goroutine tries again, pausing up to maxConnectPause between
// attempts, until it connects or the store is closed. Until it connects,
// every call fails with errStorePending; then calls go to the store it
// opened. It is safe for concurrent use.
type pendingRedis struct {
	info store.Info // fixed at creation (store.Store's contract)
	st   atomic.Pointer[redis.Store]

	connected chan struct{} // closed once st is set
	cancel    context.CancelFunc
	done      chan struct{} // closed when the connecting goroutine ends
}

// newPendingRedis returns a pending store whose goroutine calls open until
// it returns a store, logging on log. cluster says whether the URL names
// a Redis Cluster: the store's Info must be known before it connects (see
// store.Info), so a redis:// URL of a cluster's node is taken for one
// server until then (the guard then counts the nodes as one).
func newPendingRedis(open func() (*redis.Store, error), cluster bool, maxLog int64, log *slog.Logger, first error) *pendingRedis {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pendingRedis{
		info:      store.Info{SharedRecords: true, Cluster: cluster, Parts: true, MaxLogEntries: maxLog},
		connected: make(chan struct{}),
		cancel:    cancel,
		done:      make(chan struct{}),
	}
	go p.connect(ctx, open, log, first)
	return p
}

// connect calls open until it returns a store or ctx ends.
func (p *pendingRedis) connect(ctx context.Context, open func() (*redis.Store, error), log *slog.Logger, first error) {
	defer close(p.done)
	log.Warn("the store is not reachable; serving by the rules' failure modes, not ready, and connecting in the background", "err", first)
	since, logged := time.Now(), time.Now()
	pause := firstConnectPause
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s, err := open()
		if err == nil {
			if ctx.Err() != nil { // closed while connecting
				s.Close()
				return
			}
			p.st.Store(s)
			close(p.connected)
			log.Info("the store is connected", "after", time.Since(since).Round(time.Millisecond), "cluster", s.Cluster())
			if s.Cluster() != p.info.Cluster {
				log.Warn("the store's kind differs from its URL's; restart the daemon, or use a redis-cluster:// URL, for the guard to count its nodes", "cluster", s.Cluster())
			}
			return
		}
		if time.Since(logged) >= pendingLogEvery {
			log.Warn("the store is still not reachable", "for", time.Since(since).Round(time.Second), "err", err)
			logged = time.Now()
		}
		pause = min(2*pause, maxConnectPause)
		t.Reset(pause)
	}
}

// Connected returns a channel closed once the store has connected.
func (p *pendingRedis) Connected() <-chan struct{} { return p.connected }

// Store returns the connected store, nil before.
func (p *pendingRedis) Store() *redis.Store { return p.st.Load() }

// Do implements store.Store.
func (p *pendingRedis) Do(ctx context.Context, b *store.Batch) error {
	if s := p.st.Load(); s != nil {
		return s.Do(ctx, b)
	}
	return errStorePending
}

// Reset implements store.Store.
func (p *pendingRedis) Reset(ctx context.Context, keys ...string) error {
	if s := p.st.Load(); s != nil {
		return s.Reset(ctx, keys...)
	}
	return errStorePending
}

// Info implements store.Store: what was known at creation.
func (p *pendingRedis) Info() store.Info { return p.info }

// Close stops the connecting goroutine, waits for it, and closes the store
// when it has connected.
func (p *pendingRedis) Close() error {
	p.cancel()
	<-p.done
	if s := p.st.Load(); s != nil {
		return s.Close()
	}
	return nil
}

// definitive reports whether err, the failure of a Redis store to connect,
// is one that waiting will not mend: a certificate the client does not
// trust or a server that refuses the client's, a refused password, or
// anything but the store being unavailable (an invalid setting). Those
// make Start fail even when it waits for the store.
func definitive(err error) bool {
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		return true
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		redisErr *rueidis.RedisError
	)
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return true
	}
	if errors.As(err, &redisErr) {
		msg := redisErr.Error()
		for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password", "ERR DB index"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	// A TLS alert from the server (a client certificate missing or
	// refused), which crypto/tls reports as a "remote error".
	return strings.Contains(err.Error(), "remote error: tls:")
}

// pendingPools are the reservations' pools on a pending store: every call
// fails with errStorePending until the store connects, then goes to the
// pools on its connections. It is safe for concurrent use.
type pendingPools struct {
	store *pendingRedis

	mu    sync.Mutex // serializes the making of pools
	pools atomic.Pointer[redispool.Pools]
}

var _ reserve.Backend = (*pendingPools)(nil)

// backend returns the pools, made on the first call after the store
// connected.
func (p *pendingPools) backend() (*redispool.Pools, error) {
	if ps := p.pools.Load(); ps != nil {
		return ps, nil
	}
	s := p.store.Store()
	if s == nil {
		return nil, errStorePending
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.pools.Load(); ps != nil {
		return ps, nil
	}
	ps, err := redispool.New(redispool.Config{Client: s.Client(), Prefix: s.Prefix()})
	if err != nil {
		return nil, err
	}
	p.pools.Store(ps)
	return ps, nil
}

// Reserve implements reserve.Backend.
func (p *pendingPools) Reserve(ctx context.Context, pool *reserve.Pool, now int64, a reservation.Ask, secret string) (reservation.Result, []reserve.Effect, error) {
	b, err := p.backend()
	if err != nil {
		return reservation.Result{}, nil, err
	}
	return b.Reserve(ctx, pool, now, a, secret)
}

// Get implements reserve.Backend.
func (p *pendingPools) Get(ctx context.Context, handle, secret, client string, now int64) (reserve.Record, []reserve.Effect, error) {
	b, err := p.backend()
	if err != nil {
		return reserve.Record{}, nil, err
	}
	return b.Get(ctx, handle, secret, client, now)
}

// Use implements reserve.Backend.
func (p *pendingPools) Use(ctx context.Context, handle, secret, client string, now, n int64) (reserve.Record, []reserve.Effect, error) {
	b, err := p.backend()
	if err != nil {
		return reserve.Record{}, nil, err
	}
	return b.Use(ctx, handle, secret, client, now, n)
}

// Release implements reserve.Backend.
func (p *pendingPools) Release(ctx context.Context, handle, secret, client string, now int64) (reserve.Ended, []reserve.Effect, error) {
	b, err := p.backend()
	if err != nil {
		return reserve.Ended{}, nil, err
	}
	return b.Release(ctx, handle, secret, client, now)
}

// Sweep implements reserve.Backend: nothing to sweep before the store
// connects.
func (p *pendingPools) Sweep(ctx context.Context, now int64) ([]reserve.Effect, error) {
	if p.store.Store() == nil {
		return nil, nil
	}
	b, err := p.backend()
	if err != nil {
		return nil, err
	}
	return b.Sweep(ctx, now)
}

// Peek implements reserve.Backend.
func (p *pendingPools) Peek(ctx context.Context, handle, client string, now int64) (reserve.Peeked, error) {
	b, err := p.backend()
	if err != nil {
		return reserve.Peeked{}, err
	}
	return b.Peek(ctx, handle, client, now)
}
