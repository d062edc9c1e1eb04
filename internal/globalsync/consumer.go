// The consumer of the stream: a pull consumer that outlives a partition.

package globalsync

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A Sync reads the stream with one JetStream pull consumer of its own,
// kept on the server for as long as the stream keeps messages
// (InactiveThreshold is Config.MaxAge), so that it outlives a partition:
// when the connection comes back, the client asks for messages again at
// once and the others' counts arrive one lag later, with no consumer to
// make first. JetStream's ordered consumer would make a new one on every
// reconnection, one round trip more before anything is merged.
//
// Messages are not acknowledged (AckNone): those in flight when a
// connection drops are lost, and found missing by the gap in the
// consumer's sequence at the next message. A new consumer then reads
// again from the last message read in order, while the old one goes on
// delivering what is already on its way (merging a count twice changes
// nothing), until the new one has caught up; the old one is then
// deleted. A
// consumer that no longer exists (idle longer than its threshold, or
// lost by a restarted server, which keeps consumers in memory only) is
// made again the same way.

// consumeLoop sets up the stream and the consumer of every region's
// subject, and sets them up again whenever the consumer stops, until
// ctx ends.
func (s *Sync) consumeLoop(ctx context.Context, c *conn) {
	const firstWait = 100 * time.Millisecond
	wait := firstWait
	for {
		began := time.Now()
		err := s.consume(ctx, c)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute { // it worked for a while: not a failing setup
			wait = firstWait
		}
		if c.nc.IsConnected() {
			s.log.Warn("consume the other regions' counts", "err", err)
		}
		wake := s.wake
		if errors.Is(err, errStreamLost) {
			// The server may still be removing the deleted stream's
			// files: a stream made again at once can lose them.
			wake = nil
			wait = max(wait, streamLostWait)
		}
		if !sleep(ctx, wait, wake) {
			return
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// streamLostWait is the wait before making a deleted stream again.
const streamLostWait = time.Second

var (
	// errConsumerStopped is a consumer that stopped on its own.
	errConsumerStopped = errors.New("globalsync: consumer stopped")
	// errStreamLost is a stream that no longer answers publishes.
	errStreamLost = errors.New("globalsync: the stream is gone")
)

// consume creates (or updates) the stream and consumes it, from a little
// in the past or after the last message read, until ctx ends, the
// consumer stops or the stream is lost. It makes a new consumer when the
// current one missed a message or is gone.
func (s *Sync) consume(ctx context.Context, c *conn) error {
	if !s.made.Load() {
		// Not set up yet, or lost since (see streamLost); otherwise the
		// stream is there and a new consumer is all it takes.
		if err := s.request(ctx, func(ctx context.Context) error { return s.makeStream(ctx, c) }); err != nil {
			return err
		}
	}
	s.ready.Store(true)
	s.made.Store(true)
	select { // a (re)connection's wake-up is spent: the stream is set up
	case <-s.wake:
	default:
	}
	// r is the consumer read; old, when r replaced it, delivers what is
	// on its way to it until r has caught up.
	var r, old *reader
	defer func() {
		s.dropReader(c, old)
		s.dropReader(c, r)
	}()
	for {
		var next *reader
		err := s.request(ctx, func(ctx context.Context) (err error) {
			next, err = s.read(ctx, c)
			return err
		})
		if err != nil {
			return err
		}
		s.dropReader(c, old)
		old, r = r, next
		for again := false; !again; {
			select {
			case <-ctx.Done():
				return nil
			case <-r.cc.Closed():
				return errConsumerStopped
			case <-s.lost:
				return errStreamLost
			case <-r.live:
				s.dropReader(c, old)
				old = nil
			case <-r.missed:
				s.log.Debug("a message of the stream was missed: reading again from the last one read in order")
				again = true
			case <-r.gone:
				s.log.Debug("the consumer is gone: making it again")
				again = true
			}
		}
	}
}

// request runs a JetStream API request with ctx bounded by
// requestTimeout and cut short by a reconnection (see abortSetup): a
// request in flight when the connection drops gets no answer.
func (s *Sync) request(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	s.setup.Store(&cancel)
	defer s.setup.Store(nil)
	return f(ctx)
}

// makeStream creates the stream, or updates its settings.
func (s *Sync) makeStream(ctx context.Context, c *conn) error {
	cfg := jetstream.StreamConfig{
		Name:        s.cfg.Stream,
		Description: "Sluice: the regions' counts of global limits",
		Subjects:    []string{s.cfg.Subject + ".>"},
		MaxAge:      s.cfg.MaxAge,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
	}
	if _, err := c.js.CreateOrUpdateStream(ctx, cfg); err != nil {
		// Another instance may have made it with settings we cannot
		// change (storage, say): use it as it is.
		if _, err2 := c.js.Stream(ctx, s.cfg.Stream); err2 != nil {
			return err
		}
		s.log.Warn("use the stream as it is", "stream", s.cfg.Stream, "err", err)
	}
	return nil
}

// A reader asks for messages with requests that each wait on the server
// for up to 30 seconds (the client's default expiry). When the only
// request waiting expires, the server answers so, and nothing is
// delivered until the client's next request arrives: one lag later,
// messages sent meanwhile arrive two lags after they were sent. So the
// reader asks again every pullRefill messages read (a new request of
// that many), well before the oldest request expires: the regions'
// heartbeats alone (see silence.go) bring pullRefill messages within a
// few seconds. Up to pullMessages are asked for at a time, so that
// catching up after a partition (a few thousand messages, a few dozen
// bytes each) takes one request; pullBytes bounds one request's bytes,
// while a message takes at most MaxMessageSize.
const (
	pullMessages = 8192
	pullRefill   = 64
	pullBytes    = 8 * MaxMessageSize
)

// reader is one consumer of the stream and how far it has read in order.
type reader struct {
	name string
	cc   jetstream.ConsumeContext
	// next is the consumer sequence of the message expected next; skipped
	// is set once one was missed. Both are used by the message handler
	// only, which the client calls for one message at a time.
	next    uint64
	skipped bool
	// missed is told when a message was missed; gone when the consumer
	// no longer exists; live when a message read in order was the last
	// one in the stream (the consumer has caught up).
	missed, gone, live chan struct{}
	stopped            atomic.Bool // errors are no longer reported
}

// read creates a consumer of the other regions' subjects (and this
// region's, for Counts) and starts consuming it: after the last message
// read in order, or from LookBack ago when none was.
func (s *Sync) read(ctx context.Context, c *conn) (*reader, error) {
	cfg := jetstream.ConsumerConfig{
		AckPolicy: jetstream.AckNonePolicy,
		// The consumer outlives a partition as long as the messages it
		// would read (see above).
		InactiveThreshold: s.cfg.MaxAge,
		MemoryStorage:     true,
		Replicas:          1,
		FilterSubjects:    []string{s.cfg.Subject + ".>"},
	}
	if len(s.cfg.Peers) > 0 {
		cfg.FilterSubjects = cfg.FilterSubjects[:0]
		cfg.FilterSubjects = append(cfg.FilterSubjects, s.cfg.Subject+"."+s.cfg.Region) // for Counts
		for _, p := range s.cfg.Peers {
			cfg.FilterSubjects = append(cfg.FilterSubjects, s.cfg.Subject+"."+p)
		}
	}
	if seq := s.consumed.Load(); seq > 0 {
		// Read before: on from there, rather than the whole look-back.
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq+1
	} else {
		start := s.cfg.Now().Add(-s.cfg.LookBack)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	cons, err := c.js.CreateConsumer(ctx, s.cfg.Stream, cfg)
	if err != nil {
		return nil, err
	}
	r := &reader{name: cons.CachedInfo().Name, next: 1, missed: make(chan struct{}, 1), gone: make(chan struct{}, 1), live: make(chan struct{}, 1)}
	r.cc, err = cons.Consume(func(msg jetstream.Msg) { s.receive(r, msg) }, jetstream.PullMaxMessagesWithBytesLimit(pullMessages, pullBytes), jetstream.PullThresholdMessages(pullMessages-pullRefill), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if r.stopped.Load() {
			return
		}
		s.log.Debug("consumer of the other regions' counts", "err", err)
		switch {
		case errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrStreamNotFound):
			s.streamLost(err)
		case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerNotFound):
			// Nothing answers the consumer's requests for messages.
			signal(r.gone)
		}
	}))
	if err != nil {
		s.deleteConsumer(ctx, c, r.name)
		return nil, err
	}
	return r, nil
}

// receive merges one message of the stream read by r, and keeps track of
// the messages read in order.
func (s *Sync) receive(r *reader, msg jetstream.Msg) {
	s.merge(msg.Subject(), msg.Data(), s.cfg.Now())
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	switch seq := md.Sequence.Consumer; {
	case seq == r.next:
		r.next++
		if !r.skipped {
			s.consumed.Store(md.Sequence.Stream)
			if md.NumPending == 0 {
				signal(r.live)
			}
		}
	case seq > r.next:
		// The messages between were delivered to a connection that
		// dropped. Merged or not, counts only grow: this one is merged,
		// and a new consumer reads again those missed.
		r.next, r.skipped = seq+1, true
		signal(r.missed)
	}
}

// dropReader stops r, if any, and deletes its consumer.
func (s *Sync) dropReader(c *conn, r *reader) {
	if r == nil {
		return
	}
	r.stopped.Store(true)
	r.cc.Stop()
	if !c.nc.IsConnected() {
		return // it expires on the server after InactiveThreshold
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	s.deleteConsumer(ctx, c, r.name)
}

// deleteConsumer deletes the consumer name, logging a failure: left
// behind, it expires after InactiveThreshold.
func (s *Sync) deleteConsumer(ctx context.Context, c *conn, name string) {
	if err := c.js.DeleteConsumer(ctx, s.cfg.Stream, name); err != nil {
		s.log.Debug("delete a consumer", "consumer", name, "err", err)
	}
}

// signal tells ch without blocking: a signal already pending stands for
// both.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
