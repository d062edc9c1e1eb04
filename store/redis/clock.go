// An estimate of the Redis server's clock, for the fixed-window checks sent
// as plain commands (see plain.go).

package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// errTimeReply reports a reply of TIME of the wrong shape.
var errTimeReply = errors.New("malformed reply of TIME")

// Reading the server's clock: how often, how long a reading serves, and
// how fast the two clocks may drift apart meanwhile.
const (
	// clockPeriod is how often the store reads Redis' TIME.
	clockPeriod = time.Second
	// clockFresh is how long a reading is used: past it, with no newer
	// reading (Redis slow or down), every check takes the scripts.
	clockFresh = 3 * clockPeriod
	// clockDrift is the drift allowed between the two clocks since a
	// reading, as a fraction (1/5000: 200 µs a second, twice what an
	// unsynchronised quartz drifts).
	clockDrift = 5000
)

// clockReading is one reading of Redis' clock: the server's instant in µs
// since the epoch at a local instant (the middle of the round trip, on the
// monotonic clock), and the error of that pairing (half the round trip).
type clockReading struct {
	local  time.Time
	server int64 // µs since the epoch
	err    int64 // µs
}

// serverClock estimates the Redis server's clock from readings of TIME.
// The zero value has no reading. It is safe for concurrent use.
type serverClock struct {
	last atomic.Pointer[clockReading]
}

// at returns the estimate of the server's clock at the local instant now,
// in µs since the epoch, and its error in µs: the server's clock then lay
// within [server - err, server + err], unless it was stepped (a correction
// of its time, or a failover to a master whose clock differs) since the
// last reading. ok is false when there is no reading of the last
// clockFresh.
func (c *serverClock) at(now time.Time) (server, err int64, ok bool) {
	r := c.last.Load()
	if r == nil {
		return 0, 0, false
	}
	d := now.Sub(r.local)
	if d < -clockFresh || d > clockFresh {
		return 0, 0, false
	}
	us := d.Microseconds()
	return r.server + us, r.err + max(us, -us)/clockDrift + 1, true
}

// readClock reads Redis' TIME once and keeps the reading.
func (s *Store) readClock(ctx context.Context) error {
	c := s.client
	sent := time.Now()
	vals, err := c.Do(ctx, c.B().Time().Build()).AsIntSlice()
	got := time.Now()
	if err != nil {
		return s.unavailable(err)
	}
	if len(vals) != 2 {
		return s.unavailable(errTimeReply)
	}
	rtt := got.Sub(sent)
	s.clock.last.Store(&clockReading{
		local:  sent.Add(rtt / 2),
		server: vals[0]*1_000_000 + vals[1],
		err:    rtt.Microseconds()/2 + 1,
	})
	return nil
}

// startClock starts reading Redis' clock, once: a store whose checks
// never take the plain path sends no TIME.
func (s *Store) startClock() { s.clockOnce.Do(s.watchClock) }

// watchClock reads Redis' clock every clockPeriod until the store is
// closed. Close waits for it.
func (s *Store) watchClock() {
	if s.closed.Load() || s.follow == nil { // closed, or no plain path
		return
	}
	s.clockWG.Add(1)
	go func() {
		defer s.clockWG.Done()
		t := time.NewTicker(clockPeriod)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(s.stop, s.timeout)
			s.readClock(ctx) // on failure the reading ages; checks take the scripts
			cancel()
			select {
			case <-s.stop.Done():
				return
			case <-t.C:
			}
		}
	}()
}
