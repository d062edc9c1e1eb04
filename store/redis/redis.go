// Package redis is Sluice's store on Redis and Redis Cluster: instances
// that share a Redis share their counts, exactly.
//
// # One round trip, one atomic step
//
// Every call is decided by Lua scripts (embedded) that hold the
// algorithms, ported integer for integer from package algorithm:
// check.lua holds all six and decides batches, all-or-nothing checks and
// idempotency records; checkeach.lua decides independent checks of the
// five three-integer algorithms, one or many per call, and all-or-nothing
// checks of theirs on distinct keys of one slot (the rules of one check).
// The script is called with EVALSHA; after a SCRIPT FLUSH or a restart the
// server answers NOSCRIPT and the call is sent once more with EVAL, which
// loads it again. A batch of requests whose keys live on one node is one
// script call, so one round trip and one atomic step in Redis: nothing
// interleaves with it, so a limit of L admits exactly L whoever races.
// Concurrent callers share a few connections on which rueidis pipelines
// their commands automatically.
//
// # Plain fixed-window checks
//
// A fixed-window check of cost 1 (of any cost when the window counts
// refused requests) at Redis' clock, not all or nothing, is not a script
// but one HINCRBY of its window's field, sent in the same pipeline as the
// call's scripts, and admitted when the count it answers is within the
// limit: a fraction of a script's Redis CPU. The window is that of Redis'
// clock, which the store estimates by reading TIME every second (on a
// cluster, each master's; the HINCRBY is sent to the master whose clock
// placed it, and a check it redirects is decided by the script); a check
// near a window's boundary (within the estimate's error and a margin), or
// without a recent reading, takes the script. PlainChecks counts how the
// checks that could be plain were decided. A refusal's count is given back, and a window's first count given
// the window's expiry, by commands sent in the background after the
// decision. A limit of L still admits exactly L whoever races (a refusal
// is counted only at the limit, so none refuses a check that fits); what
// a process that dies meanwhile leaves is in docs/redis.md.
// Config.ScriptsOnly sends every check as a script.
//
// # Time
//
// A request whose Now is zero is decided at the Redis server's clock (TIME,
// read inside the script, or estimated for a plain fixed-window check), so
// instances agree whatever their own clocks say. A non-zero Now is used as given. A request's After moves its
// instant ahead; its key's time to live still counts from Redis' clock (or
// from the instant given).
//
// # Keys and expiry
//
// The Redis key of a request is Config.Prefix followed by its Key; a key
// longer than Config.MaxKeyLength is replaced by a fixed-length form that
// keeps its hash tag and ends with the SHA-256 of the whole key (see
// docs/redis.md). The state of a fixed window is a hash of one field, the
// window's start in quanta, holding the window's count (so that a check
// is one HINCRBY); that of the bucket algorithms, the sliding window
// counter and GCRA is a string of 25 bytes, a byte 2 and the three
// integers of algorithm.State as little-endian doubles (the text
// "1:<A>:<B>:<C>" of earlier versions, and the 25-byte string for a fixed
// window, are read too); the sliding window log is a sorted set with one
// member per admitted unit. Every written key expires once its state is equivalent to
// no state (algorithm.ExpiresAt, counted from the instant of the request)
// plus Config.ExpiryMargin, or later: a bucket's or GCRA's key written by
// the common check (one limit, one cost, Redis' clock) gets more time to
// live than it needs (twice, or, when it was still there, a window more),
// records its expiry in the state (a byte 3 in place of the 2), and is
// overwritten in place, keeping its expiry, while that expiry still
// covers the state. A denied request and a request of cost 0 write
// nothing (a plain fixed-window check counts a refusal, then gives it
// back).
//
// # Corrupt state
//
// A key holding anything the scripts do not recognise (another type, an
// older format, numbers out of range: negative, or beyond what any limit
// the store accepts could write) is deleted and decided as a new key.
// Each such reset is logged as a warning on Config.Logger and counted by
// CorruptResets and Config.OnCorrupt; it never becomes a lasting error.
//
// # Redis Cluster
//
// The keys of one identity share a hash tag (the policy package puts the
// first dimension in braces), so a batch for one identity is one script on
// one slot. A batch spanning slots is split per slot, and the parts are
// sent concurrently, pipelined per node. Check is then exact per key, as on
// one node. CheckAll is atomic within each slot only; across slots it runs
// in two phases: a probe that decides every part without writing, then,
// when every part was admitted, a commit that decides each part again and
// writes it when all of that part is admitted. Between the phases other
// callers may consume; when a part's commit is then denied, the batch is
// reported denied, and the parts already committed keep their cost. The
// store never admits beyond a limit; in that race it may charge a denied
// batch for some of its keys. CheckParts sends each master's part as a
// call of its own and reports it as soon as that master answers, so that
// a master that does not answer holds up only its own requests.
//
// While a slot moves between masters, Redis refuses a call naming several
// of its keys, some moved and some not, with TRYAGAIN, before running it;
// the store sends such a call again after a growing pause until it is
// decided or its deadline is near (TryAgainRetries counts them).
//
// # Redis Sentinel
//
// With Config.MasterSet, Addrs are Sentinels, which the client asks for
// the master and follows through failovers. The store is then a
// standalone one on whichever server is the master. Replication is
// asynchronous: counts the old master wrote but had not yet sent to the
// replica are lost when the replica is promoted. The store never reads
// from a replica (see docs/redis.md).
//
// # Failures
//
// Every call honours its context's deadline (Config.Timeout bounds a call
// whose context has none); when Redis is down, unreachable, slow or
// answers with an error, the call returns an error wrapping
// sluice.ErrStoreUnavailable.
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store"
)

// Defaults for the zero fields of a Config.
const (
	// DefaultTimeout bounds a call whose context has no deadline.
	DefaultTimeout = time.Second
	// DefaultDialTimeout bounds the opening of a connection.
	DefaultDialTimeout = time.Second
	// DefaultWriteTimeout is how long a connection may leave a ping
	// unanswered before it is closed and its calls fail.
	DefaultWriteTimeout = time.Second
	// DefaultKeepAlive is the period of TCP keep-alive probes.
	DefaultKeepAlive = 30 * time.Second
	// DefaultExpiryMargin is added to every key's time to live.
	DefaultExpiryMargin = time.Second
	// DefaultMaxKeyLength is the longest Redis key the store writes as is.
	DefaultMaxKeyLength = 512
	// DefaultMaxLogEntries is the largest limit a sliding window log may
	// have.
	DefaultMaxLogEntries = 10_000
	// SentinelRefresh is how often a client of Redis Sentinel asks the
	// Sentinels for the master, besides following their announcements of
	// a failover, in case it missed one.
	SentinelRefresh = 5 * time.Second
	// DefaultIdempotencyTTL is the time to live of an idempotency record
	// whose ttl is not positive.
	DefaultIdempotencyTTL = 5 * time.Minute
)

// Errors of the Redis store. Test for them with errors.Is.
var (
	// ErrClosed is returned by every method of a closed store. It wraps
	// sluice.ErrStoreUnavailable.
	ErrClosed = fmt.Errorf("%w: redis store closed", sluice.ErrStoreUnavailable)
	// ErrLogTooLarge reports a sliding window log whose limit is above the
	// store's Config.MaxLogEntries. Errors wrapping it also wrap
	// sluice.ErrInvalidLimit.
	ErrLogTooLarge = store.ErrLogTooLarge
	// ErrShortOutput reports an output slice shorter than the requests.
	ErrShortOutput = errors.New("sluice: output shorter than requests")
)

// Config holds the knobs of a Store. Addrs (or Client) is required; every
// other zero field takes its default.
type Config struct {
	// Addrs are the addresses (host:port) of the Redis server, or seeds of
	// a Redis Cluster (the client discovers a cluster by itself), or,
	// with MasterSet, of the Sentinels.
	Addrs []string
	// MasterSet, when set, is the name of a master monitored by Redis
	// Sentinel: Addrs are then the Sentinels', which the client asks for
	// the master's address, and which tell it of a failover (see
	// SentinelRefresh). Username, Password, DB and TLS apply to the
	// master; the Sentinels are contacted without them.
	MasterSet string
	// Username and Password authenticate (AUTH); empty means none.
	Username, Password string
	// DB is the database of a standalone server (SELECT).
	DB int
	// TLS, when set, makes connections use TLS.
	TLS *tls.Config
	// Client, when set, is used instead of a client built from the fields
	// above; Close does not close it.
	Client rueidis.Client

	// Prefix is put before every key, for instance to share a Redis
	// between deployments. Braces in it take over the hash tag.
	Prefix string
	// MaxKeyLength is the longest Redis key (prefix included) written as
	// is; longer ones are hashed, keeping their hash tag. Zero means
	// DefaultMaxKeyLength; at least 128.
	MaxKeyLength int
	// ExpiryMargin is added to the time to live of every key. Zero means
	// DefaultExpiryMargin.
	ExpiryMargin time.Duration
	// MaxLogEntries is the largest limit a sliding window log may have:
	// such a key keeps up to that many members. Zero means
	// DefaultMaxLogEntries.
	MaxLogEntries int64

	// Timeout bounds a call whose context has no deadline. Zero means
	// DefaultTimeout.
	Timeout time.Duration
	// DialTimeout bounds the opening of a connection. Zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// WriteTimeout is how long a connection may leave a ping unanswered
	// (see KeepAlive), after which it is closed and its calls fail. Zero
	// means DefaultWriteTimeout.
	WriteTimeout time.Duration

	// KeepAlive is the period of TCP keep-alive probes on the client's
	// connections, and how long one may answer nothing before it is pinged:
	// both find a peer gone silent (a crashed host, a dropped route). Zero
	// means DefaultKeepAlive; negative turns both off.
	KeepAlive time.Duration
	// ConnsPerNode is the number of connections kept to each node, over
	// which concurrent calls are pipelined: 1, 2, 4, ... up to 256 (other
	// values round up to a power of two). Zero means the client's
	// default: 4 to a standalone server (on 4 or more CPUs; fewer on
	// fewer), 1 to each node of a cluster.
	ConnsPerNode int

	// ScriptsOnly sends every check as a script call, one atomic step
	// each. By default a fixed-window check of cost 1 at Redis' clock is
	// one plain HINCRBY, which costs Redis a fraction of a script call
	// (see docs/redis.md, "Plain fixed-window checks").
	ScriptsOnly bool

	// MaxFlushDelay is how long a connection may wait to gather more
	// concurrent commands into one write; zero writes as soon as it can.
	// A few tens of microseconds save system calls on a busy client and
	// server at the cost of as much latency.
	MaxFlushDelay time.Duration

	// Logger receives a warning for every corrupt key reset. Nil means
	// slog.Default().
	Logger *slog.Logger
	// OnCorrupt, when set, is called with the number of corrupt keys reset
	// by a call (for a metric). It must be safe for concurrent use.
	OnCorrupt func(n int)
	// OnTryAgain, when set, is called with the number of script calls sent
	// again after a Redis Cluster refused them with TRYAGAIN (a slot moving
	// between masters; see TryAgainRetries), for a metric. It must be safe
	// for concurrent use.
	OnTryAgain func(n int)
	// OnPlain, when set, is called with the numbers of fixed-window checks
	// of a call that could be plain (see ScriptsOnly) and were decided by
	// their plain HINCRBY, and that were sent to a script instead (near a
	// window's boundary, no recent reading of the master's clock, a key
	// another check of the call sends to a script, a slot being moved),
	// for a metric; see PlainChecks. It is not called with ScriptsOnly.
	// It must be safe for concurrent use.
	OnPlain func(plain, script int)
}

// Store keeps the state of rate limits in Redis or Redis Cluster. Create
// it with New; it is safe for concurrent use.
type Store struct {
	client    rueidis.Client
	ownClient bool
	cluster   bool
	prefix    string
	maxKey    int
	marginMS  string // the expiry margin in ms, for check.lua
	margin    int64  // the same, for checkeach.lua
	maxLog    int64
	timeout   time.Duration
	logger    *slog.Logger
	onCorrupt func(int)
	corrupt   atomic.Uint64

	onTryAgain func(int)
	retries    atomic.Uint64
	closed     atomic.Bool

	onPlain         func(plain, script int)
	plainN, scriptN atomic.Uint64

	// The estimate of Redis' clock for the plain fixed-window checks (see
	// plain.go), read every second by the goroutine watchClock starts at
	// the first such check (clockOnce), which stop ends; noPlain sends
	// every check to the scripts.
	clock     serverClock
	clockOnce sync.Once
	clockWG   sync.WaitGroup
	noPlain   bool
	// The follow-ups of plain checks, sent by the goroutine
	// watchFollowUps starts; pending counts those not yet sent.
	follow  chan followUp
	pending atomic.Int64

	// The slot map of a cluster (see CheckParts), read again in the
	// background by the goroutine refreshSlots starts; stop ends it.
	slots        atomic.Pointer[slotMap]
	slotsTried   atomic.Int64 // when the last read began, in ns since the epoch
	slotsMu      sync.Mutex
	slotsReading bool // guarded by slotsMu
	slotsWG      sync.WaitGroup
	stop         context.Context
	cancel       context.CancelFunc
}

// New connects to Redis as cfg says and returns the store. It fails when
// no server answers within the dial timeout.
func New(cfg Config) (*Store, error) {
	if cfg.MaxKeyLength == 0 {
		cfg.MaxKeyLength = DefaultMaxKeyLength
	}
	if cfg.MaxKeyLength < 128 {
		return nil, fmt.Errorf("redis: max key length: must be at least 128, got %d", cfg.MaxKeyLength)
	}
	if cfg.ExpiryMargin == 0 {
		cfg.ExpiryMargin = DefaultExpiryMargin
	}
	if cfg.ExpiryMargin < 0 {
		return nil, fmt.Errorf("redis: expiry margin: must not be negative, got %s", cfg.ExpiryMargin)
	}
	if cfg.MaxLogEntries == 0 {
		cfg.MaxLogEntries = DefaultMaxLogEntries
	}
	if cfg.MaxLogEntries < 0 {
		return nil, fmt.Errorf("redis: max log entries: must not be negative, got %d", cfg.MaxLogEntries)
	}
	if cfg.ConnsPerNode < 0 || cfg.ConnsPerNode > 256 {
		return nil, fmt.Errorf("redis: conns per node: must be between 0 and 256, got %d", cfg.ConnsPerNode)
	}
	for _, d := range [...]struct {
		name string
		v    time.Duration
	}{{"timeout", cfg.Timeout}, {"dial timeout", cfg.DialTimeout}, {"write timeout", cfg.WriteTimeout}, {"max flush delay", cfg.MaxFlushDelay}} {
		if d.v < 0 {
			return nil, fmt.Errorf("redis: %s: must not be negative, got %s", d.name, d.v)
		}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{
		client:    cfg.Client,
		prefix:    cfg.Prefix,
		maxKey:    cfg.MaxKeyLength,
		marginMS:  strconv.FormatInt(cfg.ExpiryMargin.Milliseconds(), 10),
		margin:    cfg.ExpiryMargin.Milliseconds(),
		maxLog:    cfg.MaxLogEntries,
		timeout:   cfg.Timeout,
		logger:    cfg.Logger,
		onCorrupt: cfg.OnCorrupt,

		onTryAgain: cfg.OnTryAgain,
		onPlain:    cfg.OnPlain,
		noPlain:    cfg.ScriptsOnly,
	}
	if s.client == nil {
		if len(cfg.Addrs) == 0 {
			return nil, errors.New("redis: addrs: at least one address is required")
		}
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:       cfg.Addrs,
			Username:          cfg.Username,
			Password:          cfg.Password,
			SelectDB:          cfg.DB,
			TLSConfig:         cfg.TLS,
			Dialer:            netDialer(cfg.DialTimeout, cfg.KeepAlive),
			PipelineMultiplex: multiplex(cfg.ConnsPerNode),
			ConnWriteTimeout:  cfg.WriteTimeout,
			DisableCache:      true,
			// One call at a time (the guard's) too: a silent server is told
			// by pings, as under load, not by a read deadline per call;
			// without pings (KeepAlive < 0), by that deadline.
			AlwaysPipelining: cfg.KeepAlive >= 0,
			MaxFlushDelay:    cfg.MaxFlushDelay,
			Sentinel:         sentinelOption(cfg),
		})
		if err != nil {
			if cfg.MasterSet != "" {
				return nil, fmt.Errorf("redis: connect to master %q through Sentinels %v: %w: %w", cfg.MasterSet, cfg.Addrs, sluice.ErrStoreUnavailable, err)
			}
			return nil, fmt.Errorf("redis: connect to %v: %w: %w", cfg.Addrs, sluice.ErrStoreUnavailable, err)
		}
		s.client, s.ownClient = c, true
	}
	s.cluster = s.client.Mode() == rueidis.ClientModeCluster
	s.stop, s.cancel = context.WithCancel(context.Background())
	if !s.noPlain {
		s.follow = make(chan followUp, followQueue)
	}
	if s.cluster {
		ctx, cancel := context.WithTimeout(s.stop, cfg.Timeout)
		s.slotsTried.Store(time.Now().UnixNano())
		if m, err := s.readSlots(ctx); err == nil {
			s.slots.Store(m)
		}
		cancel()
	}
	if s.follow != nil {
		s.watchFollowUps()
	}
	return s, nil
}

// Client returns the store's Redis client, for another user of the same
// Redis (the reservations' pools, package redispool) to share its
// connections. Closing the store closes it, unless it was given in
// Config.Client.
func (s *Store) Client() rueidis.Client { return s.client }

// Prefix returns the prefix put before every key (Config.Prefix).
func (s *Store) Prefix() string { return s.prefix }

// Cluster reports whether the store talks to a Redis Cluster.
func (s *Store) Cluster() bool { return s.cluster }

// Info implements store.Store: the store keeps idempotency records shared
// by every instance, decides in parts (one per master of a cluster, one on
// a standalone server), bounds sliding window logs to MaxLogEntries, and
// decides an all-or-nothing batch of 128 units of work (store.Work) in
// about a millisecond of Redis time.
func (s *Store) Info() store.Info {
	return store.Info{SharedRecords: true, Cluster: s.cluster, Parts: true, MaxLogEntries: s.maxLog, MaxAtomicWork: maxAtomicWork}
}

// Do implements store.Store: CheckAllOnce when b.Once is set, CheckAll
// when b.All, CheckParts when b.Part is set, Check otherwise. It reports
// store.SourceStore for every request.
func (s *Store) Do(ctx context.Context, b *store.Batch) error {
	clear(b.Sources) // store.SourceStore
	switch {
	case b.Once != nil:
		replayed, err := s.CheckAllOnce(ctx, b.Once.Key, b.Once.TTL, b.Reqs, b.Out)
		b.Once.Replayed = replayed
		return err
	case b.All:
		return s.CheckAll(ctx, b.Reqs, b.Out)
	case b.Part != nil:
		return s.CheckParts(ctx, b.Reqs, b.Out, b.Part)
	}
	return s.Check(ctx, b.Reqs, b.Out)
}

// CorruptResets returns how many corrupt keys the store has reset since it
// was created.
func (s *Store) CorruptResets() uint64 { return s.corrupt.Load() }

// TryAgainRetries returns how many script calls the store has sent again,
// since it was created, after a Redis Cluster refused them with TRYAGAIN:
// a call naming several keys of a slot that is moving between masters,
// when some of the keys have moved and others not. Redis refuses such a
// call before running it, so the store sends it again, after a pause,
// until it is decided or its deadline is near.
func (s *Store) TryAgainRetries() uint64 { return s.retries.Load() }

// MaxLogEntries returns the largest limit a sliding window log may have in
// this store.
func (s *Store) MaxLogEntries() int64 { return s.maxLog }

// Accepts reports whether the store can decide requests with p: nil when it
// can, an error wrapping sluice.ErrInvalidLimit otherwise (an unknown
// algorithm, or a sliding window log above MaxLogEntries, wrapping
// ErrLogTooLarge).
func (s *Store) Accepts(p *algorithm.Params) error {
	return store.CheckParams(p, s.maxLog)
}

// Reset forgets the state of keys: their next check is decided as the
// first. Keys the store does not hold are ignored.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c := s.client
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().Del().Key(redisKey(s.prefix, k, s.maxKey)).Build()
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return s.unavailable(err)
		}
	}
	return nil
}

// Close closes the store's connections, unless the client was given in
// Config.Client. Every later call returns ErrClosed. Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.slotsMu.Lock() // no read of the slot map or of a clock starts after this
	s.slotsMu.Unlock()
	s.cancel()
	s.slotsWG.Wait()
	s.clockWG.Wait()
	if s.ownClient {
		s.client.Close()
	}
	return nil
}

// begin does the checks common to every decision.
func (s *Store) begin(reqs []store.Request, out []sluice.Decision) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if len(out) < len(reqs) {
		return fmt.Errorf("redis: %w: %d decisions for %d requests", ErrShortOutput, len(out), len(reqs))
	}
	for i := range reqs {
		r := &reqs[i]
		if err := s.Accepts(r.Params); err != nil {
			return fmt.Errorf("redis: key %q: %w", r.Key, err)
		}
		if r.Cost < 0 {
			return fmt.Errorf("redis: key %q: %w: cost %d is negative", r.Key, sluice.ErrInvalidCost, r.Cost)
		}
	}
	return nil
}

// bound gives ctx the store's timeout when it has no deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// netDialer returns the dialer of the client's connections.
func netDialer(timeout, keepAlive time.Duration) net.Dialer {
	if keepAlive == 0 {
		keepAlive = DefaultKeepAlive
	}
	return net.Dialer{Timeout: timeout, KeepAlive: keepAlive}
}

// sentinelOption returns the client's Sentinel options: none without
// cfg.MasterSet.
func sentinelOption(cfg Config) rueidis.SentinelOption {
	if cfg.MasterSet == "" {
		return rueidis.SentinelOption{}
	}
	return rueidis.SentinelOption{
		MasterSet:               cfg.MasterSet,
		Dialer:                  netDialer(cfg.DialTimeout, cfg.KeepAlive),
		TopologyRefreshInterval: SentinelRefresh,
	}
}

// multiplex returns the client's PipelineMultiplex for conns connections
// per node: log2(conns) rounded up; 0 (the client's default) for 0, and
// -1 (one connection) for 1.
func multiplex(conns int) int {
	switch {
	case conns <= 0:
		return 0
	case conns == 1:
		return -1
	}
	return min(bits.Len(uint(conns-1)), rueidis.MaxPipelineMultiplex)
}

// unavailable wraps a client error; an error reply of the server also
// wraps store.ErrReplied.
func (s *Store) unavailable(err error) error {
	if _, ok := rueidis.IsRedisErr(err); ok {
		return fmt.Errorf("redis: %w: %w: %w", sluice.ErrStoreUnavailable, store.ErrReplied, err)
	}
	return fmt.Errorf("redis: %w: %w", sluice.ErrStoreUnavailable, err)
}
