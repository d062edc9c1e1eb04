package globalsync

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is a Sync's configuration. Region is required; the zero value
// of every other field takes the default its comment gives.
type Config struct {
	// Region is this region's name, the same for all its instances: a
	// NATS subject token (no dots, wildcards or spaces) of at most
	// MaxNameLen bytes.
	Region string
	// URL is the NATS servers' URLs, comma-separated:
	// nats://host:4222[,nats://...] (tls://host:4222 for TLS with the
	// system's roots). Default nats.DefaultURL.
	URL string
	// TLS, when set, is the configuration of TLS to NATS, whatever the
	// URL's scheme: the CAs trusted (RootCAs) and a client certificate
	// for servers that verify clients. Nil: TLS only with a tls:// URL,
	// or when the server requires it.
	TLS *tls.Config
	// Stream is the JetStream stream, created if missing. Default
	// "SLUICE_SYNC".
	Stream string
	// Subject is the subjects' prefix: region R publishes on
	// <Subject>.R. Default "sluice.sync".
	Subject string
	// Peers, when set, are the other regions: their subjects (and our own
	// region's, for Counts) only are consumed, and each counts from the
	// start as a region not heard from (see silence.go) until it is, so
	// that a region cut off from the start still keeps to its share.
	// Default: every region's subject, the regions being learned from
	// their messages.
	Peers []string
	// FlushEvery is the batching period: counts observed are sent at
	// most this long after. Default 20ms.
	FlushEvery time.Duration
	// MaxPending bounds the windows whose count is held for sending
	// (newest count per window), also while NATS is unreachable.
	// Default 100,000.
	MaxPending int
	// MaxWindows bounds the windows of other regions held; counts of
	// new windows beyond it are dropped (Status.Full). Default 1,000,000.
	MaxWindows int
	// Grace is how long a window's counts are kept after its end, here
	// and in every region. Default 10s.
	Grace time.Duration
	// MaxAge is how long the stream keeps messages. Default 5m.
	MaxAge time.Duration
	// LookBack is how far back in the stream a starting instance reads,
	// to learn the current windows' counts. Default 1m. A key whose count
	// did not change within it is learnt at its next change: every
	// message carries whole counts, not increments.
	LookBack time.Duration
	// Instance names this instance in its messages. Default random.
	Instance string
	// Logger receives connection changes and failures. Default
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if err := validName(c.Region); err != nil {
		return fmt.Errorf("globalsync: region: %w", err)
	}
	c.Peers = slices.Clone(c.Peers)
	c.TLS = c.TLS.Clone()
	for _, p := range c.Peers {
		if err := validName(p); err != nil {
			return fmt.Errorf("globalsync: peer: %w", err)
		}
	}
	if c.Instance == "" {
		var b [6]byte
		rand.Read(b[:])
		c.Instance = hex.EncodeToString(b[:])
	} else if len(c.Instance) > MaxNameLen {
		return fmt.Errorf("globalsync: instance name of %d bytes, more than %d", len(c.Instance), MaxNameLen)
	}
	if c.URL == "" {
		c.URL = nats.DefaultURL
	}
	if c.Stream == "" {
		c.Stream = "SLUICE_SYNC"
	}
	if err := validName(c.Stream); err != nil {
		return fmt.Errorf("globalsync: stream: %w", err)
	}
	if c.Subject == "" {
		c.Subject = "sluice.sync"
	}
	for _, token := range strings.Split(c.Subject, ".") {
		if err := validName(token); err != nil {
			return fmt.Errorf("globalsync: subject %q: %w", c.Subject, err)
		}
	}
	if c.FlushEvery <= 0 {
		c.FlushEvery = 20 * time.Millisecond
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 100_000
	}
	if c.MaxWindows <= 0 {
		c.MaxWindows = 1_000_000
	}
	if c.Grace <= 0 {
		c.Grace = 10 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 5 * time.Minute
	}
	if c.LookBack <= 0 {
		c.LookBack = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// validName reports whether s can be a region or a stream: one NATS
// subject token.
func validName(s string) error {
	if s == "" || len(s) > MaxNameLen {
		return fmt.Errorf("%q: want 1 to %d bytes", s, MaxNameLen)
	}
	if strings.ContainsAny(s, ".*> \t\r\n") {
		return fmt.Errorf("%q: dots, wildcards and spaces are not allowed", s)
	}
	return nil
}

// maxOrigins bounds the regions a Sync keeps state for, so that messages
// under made-up region names cannot grow it without bound.
const maxOrigins = 64

// Sync publishes this region's counts of global limits and merges the
// other regions'. Observe and Others are on the check path: they take
// one shard's lock and do not allocate once a window is known. All
// methods are safe for concurrent use.
type Sync struct {
	cfg   Config
	log   *slog.Logger
	state *State
	// siblings holds the counts of this region's other instances, for
	// Counts only: this region's own count comes from its store.
	siblings *State
	out      *outbox
	born     int64 // unix ms at Start: messages sent before are catch-up, not lag

	cancel context.CancelFunc
	wg     sync.WaitGroup
	conn   atomic.Pointer[conn] // nil until the client exists
	wake   chan struct{}        // (re)connected: set up the consumer now
	ready  atomic.Bool          // the stream exists: publishing can begin
	lost   chan struct{}        // the stream stopped answering: make it again
	// resend is told of a reconnection: what was in flight is sent again
	// at once, rather than waiting for its acknowledgement's timeout (a
	// healed partition then agrees within a lag of reconnecting).
	resend chan struct{}
	// consumed is the stream sequence of the last message read in order,
	// 0 before any or after the stream was lost.
	consumed atomic.Uint64
	// made reports the stream set up by this Sync, and not lost since.
	made atomic.Bool
	// setup cancels the stream and consumer set-up in progress, if any.
	setup  atomic.Pointer[context.CancelFunc]
	closed sync.Once

	mu    sync.Mutex // guards peers
	peers map[string]*peer

	c counters
}

// conn is the NATS client and its JetStream context.
type conn struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// counters count what happened to messages, for Status.
type counters struct {
	published, sentEntries, publishErrors atomic.Int64
	received, own, malformed, foreign     atomic.Int64
	merged, stale, expired, full          atomic.Int64
}

// peer is what we know of another region's messages. Guarded by Sync.mu.
type peer struct {
	lags     [128]int64 // ms, the recent messages' lags, a ring
	n        int        // lags written
	p95      int64
	last     time.Time
	messages int64
}

// Start starts syncing with the other regions. It does not wait for
// NATS: it connects, creates the stream and subscribes in the
// background, and keeps reconnecting while NATS is unreachable; until
// then Observe holds the counts and Others returns what is known. It
// fails only on an invalid configuration. The Sync runs until Close;
// ctx only bounds Start itself.
func Start(ctx context.Context, cfg Config) (*Sync, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Sync{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "globalsync", "region", cfg.Region, "instance", cfg.Instance),
		state:    NewState(cfg.Grace, cfg.FlushEvery, cfg.MaxWindows),
		siblings: NewState(cfg.Grace, cfg.FlushEvery, cfg.MaxWindows),
		out:      newOutbox(cfg.MaxPending),
		born:     cfg.Now().UnixMilli(),
		peers:    make(map[string]*peer),
		wake:     make(chan struct{}, 1),
		lost:     make(chan struct{}, 1),
		resend:   make(chan struct{}, 1),
	}
	for _, p := range cfg.Peers {
		s.state.origin(p)
	}
	run, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.run(run)
	}()
	return s, nil
}

// Observe records this region's count for w, as its Redis returned it
// after an admission; it is sent within FlushEvery. Counts only grow
// within a window: a smaller count than one already observed is ignored.
// It never blocks on the network. When MaxPending windows are held, the
// count of a new window is dropped (Status.Dropped) until room is made;
// a window's next Observe then carries its whole count.
func (s *Sync) Observe(w Window, count int64) { s.out.observe(w, count) }

// Others returns, for window w, the sum of the other regions' latest
// counts (seen), and a reserve for what they may have admitted that has
// not reached us yet (see reserve.go). A request of global limit L is
// admitted iff own + seen + reserve < L.
func (s *Sync) Others(w Window) (seen, reserve int64) {
	return s.state.Others(w, s.cfg.Now().UnixMilli())
}

// Counts returns every region's count of w as this instance knows it: its
// own region's newest observed here or received from its other instances,
// and each other region's latest received.
// Their sum is the window's merged count. For monitoring and tests, not
// the check path.
func (s *Sync) Counts(w Window) map[string]int64 {
	m := map[string]int64{}
	s.siblings.Counts(w, m)
	s.state.Counts(w, m)
	if n := s.out.count(w); n > m[s.cfg.Region] {
		m[s.cfg.Region] = n
	}
	return m
}

// OthersWithin is Others for a window of the global limit limit: a region
// not heard from for a while (cut off, or NATS down) counts as having
// taken at least its share of limit (see silence.go).
func (s *Sync) OthersWithin(w Window, limit int64) (seen, reserve int64) {
	return s.state.OthersWithin(w, limit, s.cfg.Now().UnixMilli())
}

// Allowance returns the most this region's count of w may reach now,
// for a global limit of limit: the limit less what the other regions took
// and may have taken since (OthersWithin), and less, when other regions
// are heard from, all but this region's part of what is left.
//
// The part: when every region may still admit, each one taking what the
// others left would let each take it within one lag, N times over. So a
// region's count may exceed what the others know of it (its last count
// JetStream acknowledged) by its part of what is left as it sees it: one
// N-th, N the regions heard from and this one, and the remainder of the
// division for one region in turn (each second another, by name order),
// so that the parts add up to what is left and none of it is lost. As
// counts reach the others, what is left is shared again. Far from the
// limit, the part is far above any lag's admissions and changes nothing;
// near it, what is left is shared out in a few lags instead of overshot.
func (s *Sync) Allowance(w Window, limit int64) int64 {
	now := s.cfg.Now().UnixMilli()
	seen, reserve := s.state.OthersWithin(w, limit, now)
	free := limit - seen - reserve
	n, rank := s.state.heardRank(s.cfg.Region, now)
	if n == 1 {
		return free
	}
	known := s.out.ackedCount(w)
	left := max(free-known, 0)
	part := left / n
	if turn := (int64(fnv32(w.Key)) + now/1000) % n; turn == rank {
		part += left % n
	}
	return min(free, known+part)
}

// fnv32 is FNV-1a of s: which region's turn it is first for a key, the
// same in every region.
func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// KeyView is a Sync seen through the windows' parts rather than a Window:
// the engine's view of the other regions (engine.GlobalView).
type KeyView struct{ *Sync }

// Allowance is Sync.Allowance of the window of key that starts at start
// (unix ms) and lasts length.
func (v KeyView) Allowance(key string, start int64, length time.Duration, limit int64) int64 {
	return v.Sync.Allowance(Window{Key: key, Start: start, Length: length}, limit)
}

// Observe is Sync.Observe of the window of key that starts at start.
func (v KeyView) Observe(key string, start int64, length time.Duration, count int64) {
	v.Sync.Observe(Window{Key: key, Start: start, Length: length}, count)
}

// Status is a snapshot of a Sync's health.
type Status struct {
	Region    string
	Instance  string
	Connected bool // to a NATS server, with the stream in place
	// PendingEvents is the number of windows whose newest count
	// JetStream has not acknowledged: the same for every peer, which
	// all read the one stream.
	PendingEvents int
	// Dropped counts observations refused because MaxPending windows
	// were held, or because no message can carry the window.
	Dropped int64
	// Published and PublishErrors count messages sent and those whose
	// publish failed (and whose counts were sent again); SentEntries
	// the counts the messages sent carried.
	Published, SentEntries, PublishErrors int64
	// Received counts the messages merged; Own those of our own region
	// (ignored); Malformed the truncated, malformed and oversized ones;
	// Foreign those not of this format or version, or whose origin does
	// not match its subject. The last three are dropped.
	Received, Own, Malformed, Foreign int64
	// Merged, Stale, Expired and Full count the entries received:
	// merged, ignored as not larger than the count held, for a window
	// already dropped, or for a new window when MaxWindows are held.
	Merged, Stale, Expired, Full int64
	Windows                      int // windows held from other regions
	Peers                        []PeerStatus
}

// PeerStatus is what this instance knows of another region's messages.
type PeerStatus struct {
	Region    string
	SyncLagMs int64     // p95 of recent messages' lag, from the sender's clock to ours
	LastSync  time.Time // when its last message arrived
	Messages  int64     // messages received
	// PendingEvents is, as in Status, our windows not yet acknowledged.
	PendingEvents int
}

// Status returns a snapshot of the Sync's state. It scans the windows
// held, so it is for monitoring, not for the check path.
func (s *Sync) Status() Status {
	st := Status{
		Region:        s.cfg.Region,
		Instance:      s.cfg.Instance,
		PendingEvents: s.out.pending(),
		Dropped:       s.out.dropped.Load(),
		Published:     s.c.published.Load(),
		SentEntries:   s.c.sentEntries.Load(),
		PublishErrors: s.c.publishErrors.Load(),
		Received:      s.c.received.Load(),
		Own:           s.c.own.Load(),
		Malformed:     s.c.malformed.Load(),
		Foreign:       s.c.foreign.Load(),
		Merged:        s.c.merged.Load(),
		Stale:         s.c.stale.Load(),
		Expired:       s.c.expired.Load(),
		Full:          s.c.full.Load(),
		Windows:       s.state.Windows(),
	}
	if c := s.conn.Load(); c != nil {
		st.Connected = c.nc.IsConnected() && s.ready.Load()
	}
	s.mu.Lock()
	for name, p := range s.peers {
		st.Peers = append(st.Peers, PeerStatus{Region: name, SyncLagMs: p.p95, LastSync: p.last, Messages: p.messages, PendingEvents: st.PendingEvents})
	}
	s.mu.Unlock()
	slices.SortFunc(st.Peers, func(a, b PeerStatus) int { return strings.Compare(a.Region, b.Region) })
	return st
}

// Close sends what is pending, waiting up to two seconds for JetStream's
// acknowledgements, and stops the Sync's goroutines and connection.
func (s *Sync) Close() error {
	s.closed.Do(func() {
		s.cancel()
		s.wg.Wait()
	})
	return nil
}
