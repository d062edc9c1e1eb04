// Package redis is Sluice's store on Redis and Redis Cluster: instances
// that share a Redis share their counts, exactly.
//
// # One round trip, one atomic step
//
// Every call is decided by Lua scripts (embedded) that hold the
// algorithms, ported integer for integer from package algorithm:
// check.lua holds all six and decides batches, all-or-nothing checks and
// idempotency records; checkeach.lua decides independent checks of the
// five three-integer algorithms, one or many per call.
// The script is called with EVALSHA; after a SCRIPT FLUSH or a restart the
// server answers NOSCRIPT and the call is sent once more with EVAL, which
// loads it again. A batch of requests whose keys live on one node is one
// script call, so one round trip and one atomic step in Redis: nothing
// interleaves with it, so a limit of L admits exactly L whoever races.
// Concurrent callers share a few connections on which rueidis pipelines
// their commands automatically.
//
// # Time
//
// A request whose Now is zero is decided at the Redis server's clock (TIME,
// read inside the script), so instances agree whatever their own clocks
// say. A non-zero Now is used as given.
//
// # Keys and expiry
//
// The Redis key of a request is Config.Prefix followed by its Key; a key
// longer than Config.MaxKeyLength is replaced by a fixed-length form that
// keeps its hash tag and ends with the SHA-256 of the whole key (see
// docs/redis.md). The state of the bucket, window and GCRA algorithms is a
// string of 25 bytes, a byte 2 and the three integers of algorithm.State as
// little-endian doubles (the text "1:<A>:<B>:<C>" of earlier versions is
// read too); the sliding window log is a sorted set with one member per
// admitted unit. Every written key expires once its state is equivalent to
// no state (algorithm.ExpiresAt, counted from the instant of the request)
// plus Config.ExpiryMargin. A denied request and a request of cost 0 write
// nothing.
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
// # Failures
//
// Every call honours its context's deadline (Config.Timeout bounds a call
// whose context has none); when Redis is down, unreachable, slow or
// answers with an error, the call returns an error wrapping
// sluice.ErrStoreUnavailable.
package redis

import (
	"cmp"
	"context"
	"crypto/sha1"
	"crypto/tls"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyslot"
	"github.com/sluicehq/sluice/store"
)

// The scripts. checkeach.lua decides independent checks of every algorithm
// but the sliding window log (the common call, kept lean); check.lua
// decides everything else.
var (
	//go:embed check.lua
	checkSource string
	//go:embed checkeach.lua
	checkEachSource string

	checkScript     = newScript(checkSource)
	checkEachScript = newScript(checkEachSource)
)

// script is a Lua script and its SHA-1.
type script struct {
	src, sha string
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// Defaults for the zero fields of a Config.
const (
	// DefaultTimeout bounds a call whose context has no deadline.
	DefaultTimeout = time.Second
	// DefaultDialTimeout bounds the opening of a connection.
	DefaultDialTimeout = time.Second
	// DefaultWriteTimeout is how long a connection may fail to write or to
	// answer a health check before it is closed and its calls fail.
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
	// a Redis Cluster; the client discovers a cluster by itself.
	Addrs []string
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
	// WriteTimeout is how long a connection may stay unable to write or
	// to answer, after which it is closed and its calls fail. Zero means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration

	// KeepAlive is the period of TCP keep-alive probes on the client's
	// connections, which find a peer gone silent (a crashed host, a
	// dropped route) on an idle connection. Zero means DefaultKeepAlive;
	// negative turns them off.
	KeepAlive time.Duration
	// ConnsPerNode is the number of connections kept to each node, over
	// which concurrent calls are pipelined: 1, 2, 4, ... up to 256 (other
	// values round up to a power of two). Zero means the client's
	// default: 4 to a standalone server (on 4 or more CPUs; fewer on
	// fewer), 1 to each node of a cluster.
	ConnsPerNode int

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
			MaxFlushDelay:     cfg.MaxFlushDelay,
		})
		if err != nil {
			return nil, fmt.Errorf("redis: connect to %v: %w: %w", cfg.Addrs, sluice.ErrStoreUnavailable, err)
		}
		s.client, s.ownClient = c, true
	}
	s.cluster = s.client.Mode() == rueidis.ClientModeCluster
	s.stop, s.cancel = context.WithCancel(context.Background())
	if s.cluster {
		ctx, cancel := context.WithTimeout(s.stop, cfg.Timeout)
		s.slotsTried.Store(time.Now().UnixNano())
		if m, err := s.readSlots(ctx); err == nil {
			s.slots.Store(m)
		}
		cancel()
	}
	return s, nil
}

// Cluster reports whether the store talks to a Redis Cluster.
func (s *Store) Cluster() bool { return s.cluster }

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

// Script modes of check.lua.
const (
	modeEach  = "0"
	modeAll   = "1"
	modeOnce  = "2"
	modeProbe = "3"
)

// group is the part of a batch sent as one script call: requests whose keys
// share a slot (or all requests, on a standalone server).
type group struct {
	script *script
	idx    []int // indexes into the batch
	keys   []string
	args   []string
}

// Check decides each request on its own, in order, and writes its decision
// to out[i]; a key that appears twice sees the effect of its first request.
// When a request is invalid (a negative cost wraps sluice.ErrInvalidCost,
// a bad Params or too long a log wraps sluice.ErrInvalidLimit) Check decides
// nothing and returns the error. out must be at least as long as reqs.
func (s *Store) Check(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if err := s.begin(reqs, out); err != nil || len(reqs) == 0 {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if len(reqs) == 1 && reqs[0].Params.Algorithm != sluice.SlidingWindowLog {
		return s.checkOne(ctx, &reqs[0], &out[0])
	}
	groups := s.splitEach(reqs)
	res, err := s.exec(ctx, groups)
	var failed []int
	for g, r := range res {
		if r == nil {
			failed = append(failed, groups[g].idx...)
			continue
		}
		s.fill(reqs, out, groups[g].idx, r)
	}
	switch {
	case err == nil:
		return nil
	case len(failed) == len(reqs):
		return err
	}
	slices.Sort(failed)
	return &store.PartialError{Failed: failed, Err: err}
}

// CheckAll decides reqs as one unit: when every request is admitted, all
// consume their cost; when any is denied, none consumes anything and every
// out[i].Allowed is false. A denied request reports its own decision; a
// request that alone would have been admitted reports the state of its key
// as it stands (Remaining before its cost) with ReasonLimited and a zero
// RetryAfter. On one node (a standalone server, or keys sharing a slot) this
// is one script call, atomic; across slots of a cluster it takes two
// phases (see the package documentation). Errors are those of Check.
func (s *Store) CheckAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	if err := s.begin(reqs, out); err != nil || len(reqs) == 0 {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.checkAll(ctx, reqs, out)
}

// checkAll is CheckAll after validation, within the call's deadline.
func (s *Store) checkAll(ctx context.Context, reqs []store.Request, out []sluice.Decision) error {
	groups := s.split(reqs, modeAll, "")
	if len(groups) <= 1 {
		res, err := s.exec(ctx, groups)
		if err != nil {
			return err
		}
		for g, r := range res {
			s.fill(reqs, out, groups[g].idx, r)
		}
		return nil
	}
	// Across slots: probe every part, then commit when all are admitted.
	for _, g := range groups {
		g.args[0] = modeProbe
	}
	res, err := s.exec(ctx, groups)
	if err != nil {
		return err
	}
	all := true
	for g, r := range res {
		s.fill(reqs, out, groups[g].idx, r)
	}
	for i := range reqs {
		all = all && out[i].Allowed
	}
	if all {
		for _, g := range groups {
			g.args[0] = modeAll
		}
		if res, err = s.exec(ctx, groups); err != nil {
			return err
		}
		for g, r := range res {
			s.fill(reqs, out, groups[g].idx, r)
		}
		for i := range reqs {
			all = all && out[i].Allowed
		}
		if all {
			return nil
		}
	}
	for i := range out[:len(reqs)] {
		if out[i].Allowed {
			out[i].Allowed, out[i].Reason, out[i].RetryAfter = false, sluice.ReasonLimited, 0
		}
	}
	return nil
}

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
		tag := keyslot.Tag(slotOf(g.keys[0]))
		g.keys = append(g.keys, redisKey(s.prefix, "{"+tag+"}:"+key, s.maxKey))
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
	s.slotsMu.Lock() // no read of the slot map starts after this
	s.slotsMu.Unlock()
	s.cancel()
	s.slotsWG.Wait()
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

// split groups reqs into script calls: one on a standalone server, one
// per slot on a cluster, in the order of first appearance.
func (s *Store) split(reqs []store.Request, mode, ttlMS string) []*group {
	head := []string{mode, s.marginMS, ttlMS}
	if !s.cluster {
		g := &group{script: checkScript, idx: make([]int, len(reqs)), keys: make([]string, len(reqs)), args: make([]string, 0, 3+9*len(reqs))}
		g.args = append(g.args, head...)
		for i := range reqs {
			g.idx[i] = i
			g.keys[i] = redisKey(s.prefix, reqs[i].Key, s.maxKey)
			g.args = appendArgs(g.args, &reqs[i])
		}
		return []*group{g}
	}
	var groups []*group
	bySlot := map[uint16]*group{}
	for i := range reqs {
		k := redisKey(s.prefix, reqs[i].Key, s.maxKey)
		sl := slotOf(k)
		g := bySlot[sl]
		if g == nil {
			g = &group{script: checkScript, args: append([]string(nil), head...)}
			bySlot[sl] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, k)
		g.args = appendArgs(g.args, &reqs[i])
	}
	return groups
}

// splitEach groups reqs for Check: the requests of every algorithm but the
// sliding window log go to checkeach.lua, one call for a standalone server
// and one per slot on a cluster; those of sliding window logs go to
// check.lua, grouped as split does. exec sends the calls together, so that
// on one connection they are one write. Within a call Redis decides the
// requests in the order of reqs, and two requests of one key share an
// algorithm, so they go the same way and the second sees the first.
func (s *Store) splitEach(reqs []store.Request) []*group {
	var (
		groups []*group
		logs   []int
		one    *group // standalone: the one checkeach.lua call
		bySlot map[uint16]*group
	)
	for i := range reqs {
		r := &reqs[i]
		if r.Params.Algorithm == sluice.SlidingWindowLog {
			logs = append(logs, i)
			continue
		}
		g := one
		k := redisKey(s.prefix, r.Key, s.maxKey)
		if s.cluster {
			if bySlot == nil {
				bySlot = map[uint16]*group{}
			}
			sl := slotOf(k)
			if g = bySlot[sl]; g == nil {
				g = &group{script: checkEachScript}
				bySlot[sl] = g
				groups = append(groups, g)
			}
		} else if g == nil {
			g = &group{script: checkEachScript, idx: make([]int, 0, len(reqs)), keys: make([]string, 0, len(reqs))}
			one = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, k)
	}
	for _, g := range groups {
		g.args = s.eachArgs(reqs, g.idx)
	}
	if len(logs) == 0 {
		return groups
	}
	sub := make([]store.Request, len(logs))
	for j, i := range logs {
		sub[j] = reqs[i]
	}
	for _, g := range s.split(sub, modeEach, "") {
		for j, k := range g.idx {
			g.idx[j] = logs[k]
		}
		groups = append(groups, g)
	}
	return groups
}

// appendParams appends the 7 check.lua arguments of a parameter set.
func appendParams(args []string, p *algorithm.Params) []string {
	deny := "0" // deny all: 1; a fixed window counting refused requests: 2
	switch {
	case p.DenyAll:
		deny = "1"
	case p.CountRefused && p.Algorithm == sluice.FixedWindow:
		deny = "2"
	}
	expiry := "0" // the limit
	if p.ExpiryLimit > 0 && p.ExpiryLimit < p.Limit {
		expiry = strconv.FormatInt(p.ExpiryLimit, 10)
	}
	return append(args,
		strconv.Itoa(int(p.Algorithm)),
		strconv.FormatInt(p.Limit, 10),
		strconv.FormatInt(p.Burst, 10),
		strconv.FormatInt(p.Window, 10),
		strconv.FormatInt(p.Quantum, 10),
		deny,
		expiry,
	)
}

// appendArgs appends the 9 check.lua arguments of r: its parameter set,
// cost and instant.
func appendArgs(args []string, r *store.Request) []string {
	return append(appendParams(args, r.Params), strconv.FormatInt(r.Cost, 10), instant(r))
}

// instant is the script argument of r.Now: µs since the epoch, or -1 for
// Redis' own clock.
func instant(r *store.Request) string {
	if r.Now.IsZero() {
		return "-1"
	}
	return strconv.FormatInt(r.Now.UnixMicro(), 10)
}

// exec runs one script call per group, concurrently (pipelined per node),
// and returns their replies. A NOSCRIPT answer is retried once with EVAL,
// which loads the script; a call refused with TRYAGAIN is sent again until
// it is not, or its deadline is near (see tryAgain). When some calls fail,
// their replies are nil and the error is the first failure's; the others'
// replies are there (and their scripts have run).
func (s *Store) exec(ctx context.Context, groups []*group) ([][]int64, error) {
	c := s.client
	out := make([][]int64, len(groups))
	var results []rueidis.RedisResult
	if len(groups) == 1 {
		results = []rueidis.RedisResult{c.Do(ctx, groups[0].evalsha(c))}
	} else {
		cmds := make(rueidis.Commands, len(groups))
		for i, g := range groups {
			cmds[i] = g.evalsha(c)
		}
		results = c.DoMulti(ctx, cmds...)
	}
	var noScript, refused []int
	for i, r := range results {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok {
			switch {
			case e.IsNoScript():
				noScript = append(noScript, i)
			case e.IsTryAgain():
				refused = append(refused, i)
			}
		}
	}
	if len(noScript) > 0 {
		refused = append(refused, s.load(ctx, groups, results, noScript)...)
	}
	if len(refused) > 0 {
		s.tryAgain(ctx, groups, results, refused)
	}
	total := 0
	var first error
	for i, r := range results {
		vals, err := r.AsIntSlice()
		if err == nil && groups[i].script == checkEachScript {
			vals, err = eachReply(vals, len(groups[i].idx))
		}
		switch {
		case err != nil:
			err = s.unavailable(err)
		case len(vals) != 2+5*len(groups[i].idx):
			err = fmt.Errorf("redis: %w: script answered %d values for %d requests", sluice.ErrStoreUnavailable, len(vals), len(groups[i].idx))
		}
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		out[i] = vals
		total += int(vals[0])
	}
	if total > 0 {
		keys := make([]string, 0, 4)
		for _, g := range groups {
			keys = append(keys, g.keys...)
		}
		s.reportCorrupt(total, keys)
	}
	return out, first
}

// evalsha returns the EVALSHA call of g.
func (g *group) evalsha(c rueidis.Client) rueidis.Completed {
	return c.B().Evalsha().Sha1(g.script.sha).Numkeys(int64(len(g.keys))).Key(g.keys...).Arg(g.args...).Build()
}

// load sends the calls idx of groups again with EVAL, which loads their
// scripts, after Redis answered NOSCRIPT, and puts their replies in
// results. It returns those of idx that Redis refused with TRYAGAIN.
func (s *Store) load(ctx context.Context, groups []*group, results []rueidis.RedisResult, idx []int) (refused []int) {
	c := s.client
	cmds := make(rueidis.Commands, len(idx))
	for j, i := range idx {
		g := groups[i]
		cmds[j] = c.B().Eval().Script(g.script.src).Numkeys(int64(len(g.keys))).Key(g.keys...).Arg(g.args...).Build()
	}
	for j, r := range c.DoMulti(ctx, cmds...) {
		results[idx[j]] = r
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsTryAgain() {
			refused = append(refused, idx[j])
		}
	}
	return refused
}

// Pauses before a call refused with TRYAGAIN is sent again: the first,
// doubled at each refusal up to the longest. The reserve is the time that
// must remain before the deadline when a call is sent again: at least
// tryAgainReserve, a tenth of the time left at the first refusal, and
// twice the longest round trip of the calls sent again.
const (
	tryAgainFirstWait = time.Millisecond
	tryAgainMaxWait   = 32 * time.Millisecond
	tryAgainReserve   = 500 * time.Microsecond
)

// tryAgain sends the calls idx of groups again, after a pause, for as long
// as Redis refuses them with TRYAGAIN, and puts their replies in results.
// Redis answers TRYAGAIN, before running anything, to a call naming keys
// of a slot that is moving between masters when some of them have moved
// and others not: sending the call again is exact, and once the keys are
// on one node it is decided. Only TRYAGAIN is retried, never an error
// after which the call may have run. A call of one key is never refused
// so (Redis redirects it with ASK), which is why checkOne does not retry.
// The pauses grow from tryAgainFirstWait to tryAgainMaxWait; a call is
// sent again only while the reserve remains before the deadline of ctx,
// so that a slot split for longer than the deadline fails with the
// TRYAGAIN refusal, in time for the failure mode.
//
// rueidis also marks TRYAGAIN for retry, but only for commands marked
// retryable, and in a pipeline it sends again every retryable command
// that failed in the same round, a broken connection included, whenever
// another was redirected: a script marked so could run twice. Hence the
// retry here, where only a TRYAGAIN refusal is sent again.
func (s *Store) tryAgain(ctx context.Context, groups []*group, results []rueidis.RedisResult, idx []int) {
	c := s.client
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(s.timeout)
	}
	reserve := max(tryAgainReserve, time.Until(dl)/10)
	for wait := tryAgainFirstWait; len(idx) > 0; wait = min(2*wait, tryAgainMaxWait) {
		left := time.Until(dl) - reserve
		if left <= 0 {
			return
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.retries.Add(uint64(len(idx)))
		if s.onTryAgain != nil {
			s.onTryAgain(len(idx))
		}
		cmds := make(rueidis.Commands, len(idx))
		for j, i := range idx {
			cmds[j] = groups[i].evalsha(c)
		}
		sent := time.Now()
		var noScript, refused []int
		for j, r := range c.DoMulti(ctx, cmds...) {
			results[idx[j]] = r
			if e, ok := rueidis.IsRedisErr(r.Error()); ok {
				switch {
				case e.IsNoScript():
					noScript = append(noScript, idx[j])
				case e.IsTryAgain():
					refused = append(refused, idx[j])
				}
			}
		}
		if len(noScript) > 0 {
			refused = append(refused, s.load(ctx, groups, results, noScript)...)
		}
		reserve = max(reserve, 2*time.Since(sent))
		idx = refused
	}
}

// reportCorrupt logs and counts n corrupt keys reset by a call on keys.
func (s *Store) reportCorrupt(n int, keys []string) {
	s.corrupt.Add(uint64(n))
	s.logger.Warn("redis store: reset corrupt rate-limit state", "keys_reset", n, "batch_keys", keys)
	if s.onCorrupt != nil {
		s.onCorrupt(n)
	}
}

// fill converts a script reply for the requests idx into decisions.
func (s *Store) fill(reqs []store.Request, out []sluice.Decision, idx []int, vals []int64) {
	for j, i := range idx {
		out[i] = decision(reqs[i].Params, vals[2+5*j:7+5*j])
	}
}

// decision returns the decision of a request with params p from the five
// values a script answers for it: allowed (0/1), reason, remaining, reset
// after and retry after (in quanta).
func decision(p *algorithm.Params, v []int64) sluice.Decision {
	return sluice.Decision{
		Allowed:    v[0] == 1,
		Reason:     sluice.Reason(v[1]),
		Limit:      p.Limit,
		Remaining:  v[2],
		ResetAfter: p.Duration(v[3]),
		RetryAfter: p.Duration(v[4]),
	}
}

// netDialer returns the dialer of the client's connections.
func netDialer(timeout, keepAlive time.Duration) net.Dialer {
	if keepAlive == 0 {
		keepAlive = DefaultKeepAlive
	}
	return net.Dialer{Timeout: timeout, KeepAlive: keepAlive}
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
