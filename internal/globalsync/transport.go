package globalsync

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Transport timings.
const (
	// requestTimeout bounds one JetStream API request (stream, consumer).
	requestTimeout = 5 * time.Second
	// ackTimeout is how long a publish waits for JetStream's
	// acknowledgement before its counts are sent again.
	ackTimeout = 5 * time.Second
	// closeWait is how long Close waits for the last acknowledgements.
	closeWait = 2 * time.Second
	// sweepEvery is the period of dropping expired windows.
	sweepEvery = time.Second
	// maxBatch bounds the entries of one message; batchBytes bounds its
	// size before compression, well below MaxMessageSize and NATS's
	// default 1 MiB payload limit.
	maxBatch   = 4096
	batchBytes = MaxMessageSize / 2
)

// run owns the connection: it connects, starts the consumer and runs the
// publish loop until ctx ends, then sends what is pending and closes.
func (s *Sync) run(ctx context.Context) {
	log := s.log
	var nc *nats.Conn
	for {
		var err error
		opts := []nats.Option{
			nats.Name("sluice-globalsync " + s.cfg.Region + " " + s.cfg.Instance),
			nats.RetryOnFailedConnect(true), // connect in the background when NATS is down
			nats.MaxReconnects(-1),
			// A healed partition is noticed within this and a jitter of
			// as much again (so that instances do not all try at once);
			// reconnecting then takes two lags (the server's greeting,
			// and its answer to the client's), the others' counts one
			// more (see consumer.go).
			nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(20*time.Millisecond, 20*time.Millisecond),
			// No buffering while disconnected: the outbox keeps the
			// newest counts, which is all that needs sending.
			nats.ReconnectBufSize(-1),
			nats.ConnectHandler(func(*nats.Conn) {
				log.Info("connected to NATS")
				s.wakeConsumer()
			}),
			nats.ReconnectHandler(func(c *nats.Conn) {
				log.Info("reconnected to NATS", "server", c.ConnectedUrlRedacted())
				// The consumer reads on by itself; a request in flight
				// (making the stream or a consumer) gets no answer.
				s.abortSetup()
				s.wakeConsumer()
				signal(s.resend)
			}),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					log.Warn("disconnected from NATS", "err", err)
				}
			}),
		}
		if s.cfg.TLS != nil {
			opts = append(opts, nats.Secure(s.cfg.TLS))
		}
		nc, err = nats.Connect(s.cfg.URL, opts...)
		if err == nil {
			break
		}
		log.Error("connect to NATS", "url", s.cfg.URL, "err", err)
		if !sleep(ctx, time.Second, nil) {
			return
		}
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackTimeout))
	if err != nil { // only on invalid options
		log.Error("set up JetStream", "err", err)
		return
	}
	c := &conn{nc: nc, js: js}
	s.conn.Store(c)

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.consumeLoop(ctx, c)
	}()
	s.publishLoop(ctx, c)
	<-done
}

// sleep waits d, or until wake receives, and reports false when ctx
// ended first.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
	}
	return true
}

// abortSetup cuts short the JetStream request in progress (making the
// stream or a consumer), if any: the consume loop tries again at once.
func (s *Sync) abortSetup() {
	if abort := s.setup.Load(); abort != nil {
		(*abort)()
	}
}

// wakeConsumer cuts short the consume loop's wait before its next try:
// the connection is back, so the stream can be set up now.
func (s *Sync) wakeConsumer() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// inflight is a published message whose acknowledgement is awaited.
type inflight struct {
	f       jetstream.PubAckFuture
	entries []Entry
}

// publisher is the publish loop's state.
type publisher struct {
	c        *conn
	subject  string
	seq      uint64
	inflight []inflight
	last     time.Time // when a message was last published
}

// publishLoop sends the counts that grew every FlushEvery and sweeps
// expired windows, until ctx ends; then it sends what is left and waits
// a little for the acknowledgements.
func (s *Sync) publishLoop(ctx context.Context, c *conn) {
	p := &publisher{c: c, subject: s.cfg.Subject + "." + s.cfg.Region}
	flush := time.NewTicker(s.cfg.FlushEvery)
	defer flush.Stop()
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			s.flush(p)
			if len(p.inflight) > 0 {
				select {
				case <-c.js.PublishAsyncComplete():
				case <-time.After(closeWait):
				}
				s.reap(p)
			}
			return
		case <-flush.C:
			s.flush(p)
		case <-s.resend:
			// Reconnected: what was in flight may never be acknowledged;
			// its counts go again (merging them twice changes nothing).
			for _, x := range p.inflight {
				s.out.failed(x.entries)
			}
			p.inflight = p.inflight[:0]
			s.flush(p)
		case <-sweep.C:
			now := s.cfg.Now().UnixMilli()
			s.state.Sweep(now)
			s.siblings.Sweep(now)
			s.state.forget(now)
			s.out.sweep(now, s.cfg.Grace.Milliseconds())
		}
	}
}

// flush publishes the counts that grew since the last flush, batched,
// when connected; otherwise they wait in the outbox.
func (s *Sync) flush(p *publisher) {
	s.reap(p)
	if !p.c.nc.IsConnected() || !s.ready.Load() {
		return
	}
	entries := s.out.take(nil)
	now := s.cfg.Now()
	if len(entries) == 0 && now.Sub(p.last) >= heartbeatFlushes*s.cfg.FlushEvery && s.out.pending() == 0 {
		// A heartbeat: nothing grew, every count is acknowledged, and
		// the other regions learn that this one is reachable and up to
		// date (see silence.go). With counts unacknowledged it stays
		// silent: heard again, it would be counted at counts the others
		// may not have.
		p.seq++
		data, err := AppendEncode(nil, &Message{Origin: s.cfg.Region, Instance: s.cfg.Instance, SentAt: now.UnixMilli(), Seq: p.seq})
		if err == nil {
			if _, err := p.c.js.PublishMsgAsync(&nats.Msg{Subject: p.subject, Data: data}); err == nil {
				p.last = now
				s.c.published.Add(1)
			}
		}
		return
	}
	// In start order, each entry's start costs a byte (see codec.go).
	slices.SortFunc(entries, func(a, b Entry) int { return cmp.Compare(a.Start, b.Start) })
	for len(entries) > 0 {
		n, size := 0, 0
		for n < len(entries) && n < maxBatch && size < batchBytes {
			size += len(entries[n].Key) + 3*binary.MaxVarintLen64
			n++
		}
		batch := entries[:n:n]
		entries = entries[n:]
		p.seq++
		m := Message{Origin: s.cfg.Region, Instance: s.cfg.Instance, SentAt: s.cfg.Now().UnixMilli(), Seq: p.seq, Entries: batch}
		data, err := AppendEncode(nil, &m)
		if err != nil { // the outbox admits only entries a message can carry
			s.log.Error("encode a batch of counts", "err", err)
			continue
		}
		f, err := p.c.js.PublishMsgAsync(&nats.Msg{Subject: p.subject, Data: data})
		if err != nil {
			s.publishFailed(batch, err)
			continue
		}
		s.c.published.Add(1)
		s.c.sentEntries.Add(int64(len(batch)))
		p.last = now
		p.inflight = append(p.inflight, inflight{f: f, entries: batch})
	}
}

// reap records the acknowledgements received: acknowledged counts are
// done, failed ones go back to the outbox to be sent again.
func (s *Sync) reap(p *publisher) {
	p.inflight = slices.DeleteFunc(p.inflight, func(x inflight) bool {
		select {
		case <-x.f.Ok():
			s.out.acked(x.entries)
			return true
		case err := <-x.f.Err():
			s.publishFailed(x.entries, err)
			return true
		default:
			return false
		}
	})
}

// publishFailed puts the entries of a failed publish back in the outbox.
// When no stream answered (deleted, or a server that lost its files), it
// has the consume loop make the stream again.
func (s *Sync) publishFailed(entries []Entry, err error) {
	s.c.publishErrors.Add(1)
	s.out.failed(entries)
	s.log.Debug("publish counts", "entries", len(entries), "err", err)
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		s.streamLost(err)
	}
}

// streamLost has the consume loop make the stream and the consumer
// again: the stream was deleted, or the server lost its files. A consumer
// made again resumes after the last sequence read, which would skip the
// new stream's first messages: this one starts from the look-back.
func (s *Sync) streamLost(err error) {
	s.consumed.Store(0) // a stream made again numbers from 1
	s.made.Store(false)
	if s.ready.CompareAndSwap(true, false) {
		s.log.Warn("the stream is gone: making it again", "stream", s.cfg.Stream, "err", err)
		select {
		case s.lost <- struct{}{}:
		default:
		}
	}
}

// merge decodes a message received on subject at now and merges its
// counts, counting what it drops and why.
func (s *Sync) merge(subject string, data []byte, now time.Time) {
	m, err := Decode(data)
	switch {
	case errors.Is(err, ErrForeign):
		s.c.foreign.Add(1)
		return
	case err != nil:
		s.c.malformed.Add(1)
		return
	case subject != s.cfg.Subject+"."+m.Origin:
		s.c.foreign.Add(1) // a region publishing under another's name
		return
	case m.Origin == s.cfg.Region:
		// Never this region's view of the others; but the counts of
		// its other instances complete Counts.
		s.c.own.Add(1)
		if m.Instance != s.cfg.Instance {
			ms := now.UnixMilli()
			for _, e := range m.Entries {
				s.siblings.Merge(m.Origin, e.Window, e.Count, m.SentAt, ms)
			}
		}
		return
	}
	ms := now.UnixMilli()
	s.mu.Lock()
	p := s.peers[m.Origin]
	if p == nil {
		if len(s.peers) >= maxOrigins {
			s.mu.Unlock()
			s.c.foreign.Add(1)
			return
		}
		p = &peer{}
		s.peers[m.Origin] = p
	}
	p.messages++
	p.last = now
	if m.SentAt >= s.born { // older ones are catch-up, not lag
		p.lags[p.n%len(p.lags)] = max(ms-m.SentAt, 0)
		p.n++
		p.p95 = p95(p.lags[:min(p.n, len(p.lags))])
	}
	lag := p.p95
	s.mu.Unlock()
	s.state.SetLag(m.Origin, lag)
	// A message shows that its region was reachable when it was sent,
	// not when it is read: one read long after (catch-up, or read again
	// by a new consumer, see consumer.go) must not have a quiet region
	// counted as heard now. One lag after sending is when it would have
	// arrived (the lag takes in the difference between the clocks).
	s.state.Heard(m.Origin, min(ms, m.SentAt+lag))
	s.c.received.Add(1)
	for _, e := range m.Entries {
		switch s.state.Merge(m.Origin, e.Window, e.Count, m.SentAt, ms) {
		case Merged:
			s.c.merged.Add(1)
		case Stale:
			s.c.stale.Add(1)
		case Expired:
			s.c.expired.Add(1)
		case Full:
			s.c.full.Add(1)
		}
	}
}

// p95 returns the 95th percentile of lags (nearest rank).
func p95(lags []int64) int64 {
	if len(lags) == 0 {
		return 0
	}
	var buf [128]int64
	sorted := append(buf[:0], lags...)
	slices.Sort(sorted)
	return sorted[(len(sorted)*95+99)/100-1]
}
