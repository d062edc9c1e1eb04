// What follows a plain fixed-window check: a refusal given back, a
// window's first count given its expiry.

package redis

import (
	"context"
	"strconv"

	"github.com/redis/rueidis"
)

// followUp is the work left after a plain check (see plain.go): give back
// n units of the field (fwback.lua), or, for a window's first count
// (first), set the key's expiry to n ms since the epoch unless it ends
// later already (PEXPIREAT NX, then GT: the expiry of a key written at an
// instant ahead of Redis' clock is not shortened) and drop the previous
// window's field prev (HDEL), which a key holds until the expiry margin
// past that window's end.
type followUp struct {
	first      bool
	key, field string
	n          int64
	prev       string
}

// Bounds of the follow-ups queued: how many wait at most (past that, the
// check sends its own and waits for them) and how many go in one pipeline.
const (
	followQueue = 4096
	followBatch = 256
)

// queueFollowUp queues f, to be sent by the goroutine watchFollowUps
// starts, without waiting for it: the checks are decided already, and a
// delay changes no decision (see plain.go). When the queue is full, f is
// sent at once.
func (s *Store) queueFollowUp(f followUp) {
	s.pending.Add(1)
	select {
	case s.follow <- f:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		s.doFollowUps(ctx, []followUp{f})
		cancel()
		s.pending.Add(-1)
	}
}

// watchFollowUps sends the queued follow-ups, as many as are waiting (up
// to followBatch) in one pipeline, until the store is closed; then it
// sends those left. Close waits for it.
func (s *Store) watchFollowUps() {
	s.clockWG.Add(1)
	go func() {
		defer s.clockWG.Done()
		batch := make([]followUp, 0, followBatch)
		for {
			var ctx context.Context
			select {
			case f := <-s.follow:
				batch = append(batch, f)
				ctx = s.stop
			case <-s.stop.Done():
				ctx = context.Background()
			}
		drain:
			for len(batch) < followBatch {
				select {
				case f := <-s.follow:
					batch = append(batch, f)
				default:
					break drain
				}
			}
			if len(batch) > 0 {
				c, cancel := context.WithTimeout(ctx, s.timeout)
				s.doFollowUps(c, batch)
				cancel()
				s.pending.Add(-int64(len(batch)))
				batch = batch[:0]
			}
			if ctx != s.stop && len(s.follow) == 0 {
				return
			}
		}
	}()
}

// doFollowUps sends fs in one pipeline, and the scripts that Redis
// answers NOSCRIPT again with EVAL, which loads them. A follow-up that
// fails leaves a refused unit counted (which refuses more, never admits
// more) or a key without its window's expiry (see plain.go).
func (s *Store) doFollowUps(ctx context.Context, fs []followUp) {
	c := s.client
	cmds := make(rueidis.Commands, 0, 3*len(fs))
	var backs []int // for each fwback.lua call: its index in fs, then in cmds
	for k, f := range fs {
		if !f.first {
			backs = append(backs, k, len(cmds))
			cmds = append(cmds, c.B().Evalsha().Sha1(fwBackScript.sha).Numkeys(1).Key(f.key).Arg(f.field, strconv.FormatInt(f.n, 10)).Build())
			continue
		}
		if f.prev != "" {
			cmds = append(cmds, c.B().Hdel().Key(f.key).Field(f.prev).Build())
		}
		cmds = append(cmds,
			c.B().Pexpireat().Key(f.key).MillisecondsTimestamp(f.n).Nx().Build(),
			c.B().Pexpireat().Key(f.key).MillisecondsTimestamp(f.n).Gt().Build())
	}
	res := c.DoMulti(ctx, cmds...)
	var again rueidis.Commands
	for j := 0; j < len(backs); j += 2 {
		if e, ok := rueidis.IsRedisErr(res[backs[j+1]].Error()); ok && e.IsNoScript() {
			f := &fs[backs[j]]
			again = append(again, c.B().Eval().Script(fwBackScript.src).Numkeys(1).Key(f.key).Arg(f.field, strconv.FormatInt(f.n, 10)).Build())
		}
	}
	if len(again) > 0 {
		c.DoMulti(ctx, again...)
	}
}
