package redispool

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/reservation"
)

// script is a Lua script and its SHA-1.
type script struct{ src, sha string }

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// Pauses before a call refused with TRYAGAIN (a slot moving between the
// masters of a cluster, some of the pool's keys moved and some not) is
// sent again: the first, doubled up to the longest, while the context
// allows. Redis refuses such a call before running it, so sending it
// again is exact.
const (
	tryAgainFirstWait = time.Millisecond
	tryAgainMaxWait   = 32 * time.Millisecond
)

// run runs script s on the pool of handle with args, sending also extra
// (when built) in the same round trip, and returns its reply.
func (p *Pools) run(ctx context.Context, s *script, handle string, args []string, extra rueidis.Completed) (*reply, error) {
	var res rueidis.RedisResult
	if extra.IsEmpty() {
		res = p.client.Do(ctx, p.call(s, handle, args, false))
	} else {
		both := p.client.DoMulti(ctx, p.call(s, handle, args, false), extra)
		res = both[0]
		if both[1].Error() != nil {
			// The next Reserve registers the pool again.
			p.mu.Lock()
			delete(p.registered, handle)
			p.mu.Unlock()
		}
	}
	return p.settle(ctx, s, handle, args, res)
}

// call returns the EVALSHA (or, when eval is set, the EVAL) of s on the
// pool of handle with args.
func (p *Pools) call(s *script, handle string, args []string, eval bool) rueidis.Completed {
	c, keys := p.client, p.keys(handle)
	if eval {
		return c.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// settle reads the answer res to a call of s: after a NOSCRIPT it sends
// the call once more with EVAL, which loads the script; after a TRYAGAIN,
// again after a pause while ctx allows. It returns the reply with its
// head (code, names, queue length) read.
func (p *Pools) settle(ctx context.Context, s *script, handle string, args []string, res rueidis.RedisResult) (*reply, error) {
	for wait := tryAgainFirstWait; ; wait = min(2*wait, tryAgainMaxWait) {
		e, ok := rueidis.IsRedisErr(res.Error())
		switch {
		case ok && e.IsNoScript():
			res = p.client.Do(ctx, p.call(s, handle, args, true))
			continue
		case ok && e.IsTryAgain():
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, p.unavailable(ctx.Err())
			case <-t.C:
			}
			res = p.client.Do(ctx, p.call(s, handle, args, false))
			continue
		}
		break
	}
	vals, err := res.ToArray()
	if err != nil {
		return nil, p.unavailable(err)
	}
	r := &reply{vals: vals}
	r.code = r.int()
	r.rule, r.resource = r.str(), r.str()
	p.noteQueue(handle, r.int())
	if r.err != nil {
		return nil, p.unavailable(r.err)
	}
	return r, nil
}

// reply reads the values of a script's reply in order; the first value
// of a type not expected sets err.
type reply struct {
	vals           []rueidis.RedisMessage
	i              int
	err            error
	code           int64
	rule, resource string
	granted        int // the number of grants in the head
}

func (r *reply) next() *rueidis.RedisMessage {
	if r.i >= len(r.vals) {
		if r.err == nil {
			r.err = errors.New("reply too short")
		}
		return nil
	}
	r.i++
	return &r.vals[r.i-1]
}

func (r *reply) int() int64 {
	m := r.next()
	if m == nil {
		return 0
	}
	n, err := m.AsInt64()
	if err != nil && r.err == nil {
		r.err = err
	}
	return n
}

func (r *reply) str() string {
	m := r.next()
	if m == nil {
		return ""
	}
	s, err := m.ToString()
	if err != nil && r.err == nil {
		r.err = err
	}
	return s
}

// done returns the error of reading the reply, if any, as the store's.
func (r *reply) done() error {
	if r.err != nil {
		return fmt.Errorf("redispool: %w: %w", sluice.ErrStoreUnavailable, r.err)
	}
	return nil
}

// head reads the effects of the reply (after the code, the pool's names
// and its queue length, which run read) and returns them with the
// error the code means.
func (r *reply) head() ([]reserve.Effect, error) {
	var fx []reserve.Effect
	for n := r.int(); n > 0 && r.err == nil; n-- {
		fx = append(fx, reserve.Effect{Type: events.ReservationExpired, Secret: r.str(), Client: r.str(),
			Tokens: r.int(), Rule: r.rule, Resource: r.resource})
	}
	r.granted = int(r.int())
	for n := r.granted; n > 0 && r.err == nil; n-- {
		fx = append(fx, reserve.Effect{Type: events.ReservationGranted, Secret: r.str(), Client: r.str(),
			Tokens: r.int(), ExpiresAt: r.int(), Rule: r.rule, Resource: r.resource})
	}
	if r.err != nil {
		return nil, fmt.Errorf("redispool: %w: %w", sluice.ErrStoreUnavailable, r.err)
	}
	switch r.code {
	case codeOK:
		return fx, nil
	case codeInvalid:
		return fx, &reservation.InvalidError{Field: r.str(), Reason: r.str()}
	case codeQueueFull:
		return fx, reservation.ErrQueueFull
	case codeNotFound:
		return fx, reservation.ErrNotFound
	case codeInsufficient:
		return fx, reservation.ErrInsufficient
	case codeNotQueued:
		return fx, reservation.ErrNotQueued
	case codeNotGranted:
		return fx, reservation.ErrNotGranted
	case codeForbidden:
		return fx, reserve.ErrForbidden
	}
	return fx, fmt.Errorf("redispool: %w: script answered code %d", sluice.ErrStoreUnavailable, r.code)
}

// The codes of the scripts' replies (see pool.lua).
const (
	codeOK = iota
	codeInvalid
	codeQueueFull
	codeNotFound
	codeInsufficient
	codeNotQueued
	codeNotGranted
	codeForbidden
)
