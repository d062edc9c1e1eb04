// An estimate of the Redis server's clock, for the fixed-window checks sent
// as plain commands (see plain.go).

package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
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

// readClock reads the TIME of the server c talks to, once, and keeps the
// reading in clk.
func (s *Store) readClock(ctx context.Context, c rueidis.Client, clk *serverClock) error {
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
	clk.last.Store(&clockReading{
		local:  sent.Add(rtt / 2),
		server: vals[0]*1_000_000 + vals[1],
		err:    rtt.Microseconds()/2 + 1,
	})
	return nil
}

// startClock starts reading Redis' clock, once: a store whose checks
// never take the plain path sends no TIME. On a cluster each master's
// clock is started so (startMasterClock).
func (s *Store) startClock() {
	s.clockOnce.Do(func() { s.watchClock(nil, s.client, &s.clock) })
}

// watchClock reads the clock of the server c talks to into clk every
// clockPeriod until the store is closed, or gone is closed (on a cluster,
// when the master has left the slot map). Close waits for it.
func (s *Store) watchClock(gone <-chan struct{}, c rueidis.Client, clk *serverClock) {
	if s.follow == nil || c == nil { // no plain path
		return
	}
	// Under slotsMu, which Close takes once the store is closed: a
	// goroutine is either counted before Close waits, or not started.
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	if s.closed.Load() {
		return
	}
	s.clockWG.Add(1)
	go func() {
		defer s.clockWG.Done()
		t := time.NewTicker(clockPeriod)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(s.stop, s.timeout)
			s.readClock(ctx, c, clk) // on failure the reading ages; checks take the scripts
			cancel()
			select {
			case <-s.stop.Done():
				return
			case <-gone:
				return
			case <-t.C:
			}
		}
	}()
}
