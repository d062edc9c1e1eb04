// The Lua scripts and calling them: EVALSHA, NOSCRIPT and TRYAGAIN.

package redis

import (
	"cmp"
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
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

// instant is the script argument of r's instant: µs since the epoch, or
// -1 - d for Redis' own clock plus d µs (r.After).
func instant(r *store.Request) string {
	return strconv.FormatInt(instantMicros(r), 10)
}

// exec runs one script call per group, concurrently (pipelined per node),
// and returns their replies. A NOSCRIPT answer is retried once with EVAL,
// which loads the script; a call refused with TRYAGAIN is sent again until
// it is not, or its deadline is near (see tryAgain). When some calls fail,
// their replies are nil and the error is the first failure's; the others'
// replies are there (and their scripts have run).
func (s *Store) exec(ctx context.Context, groups []*group) ([][]int64, error) {
	out, _, err := s.execWith(ctx, groups, nil)
	return out, err
}

// execWith is exec, with the commands more sent after the script calls in
// the same pipeline; it returns their replies too.
func (s *Store) execWith(ctx context.Context, groups []*group, more rueidis.Commands) ([][]int64, []rueidis.RedisResult, error) {
	c := s.client
	out := make([][]int64, len(groups))
	var results, extra []rueidis.RedisResult
	switch {
	case len(groups) == 1 && len(more) == 0:
		results = []rueidis.RedisResult{c.Do(ctx, groups[0].evalsha(c))}
	case len(groups) == 0 && len(more) == 1:
		extra = []rueidis.RedisResult{c.Do(ctx, more[0])}
	default:
		cmds := make(rueidis.Commands, len(groups), len(groups)+len(more))
		for i, g := range groups {
			cmds[i] = g.evalsha(c)
		}
		cmds = append(cmds, more...)
		all := c.DoMulti(ctx, cmds...)
		results, extra = all[:len(groups):len(groups)], all[len(groups):]
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
		var vals []int64
		var err error
		if g := groups[i]; g.script == checkEachScript {
			var raw []byte
			if raw, err = r.AsBytes(); err == nil {
				vals, err = eachValues(raw)
			}
			if err == nil {
				vals, err = eachReply(vals, len(g.idx), g.uniform)
			}
		} else {
			vals, err = r.AsIntSlice()
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
	return out, extra, first
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
