-- Sluice: decide a batch of rate-limit checks in one atomic step.
--
-- This script computes, integer for integer, the state transitions of the Go
-- package algorithm (Apply, ApplyLog, ExpiresAt). Lua numbers are doubles,
-- exact up to 2^53; the algorithms keep every intermediate value within
-- 2^51, and idiv below divides exactly.
--
-- KEYS[1..n]   the state keys of the n requests (KEYS[n+1]: the idempotency
--              key in mode 2)
-- ARGV[1]      mode: 0 check each request on its own, 1 all or nothing,
--              2 all or nothing recorded under KEYS[n+1], 3 probe (decide
--              all or nothing and write nothing)
-- ARGV[2]      the expiry margin in milliseconds
-- ARGV[3]      the record's time to live in milliseconds (mode 2)
-- ARGV[4..]    9 per request: algorithm, limit, burst, window, quantum,
--              deny all (0/1; 2: a fixed window counting refused requests), expiry limit (algorithm.Params.ExpiryLimit;
--              0: the limit), cost, now (µs since the epoch; -1 - d: Redis TIME plus d µs)
--
-- Reply: {corrupt keys reset, replayed (0/1), then 5 per request: allowed
-- (0/1), reason, remaining, reset after (quanta), retry after (quanta)}.
--
-- State layout: the algorithms with three integers keep the 25 bytes
-- struct.pack('<Bddd', 2, A, B, C), integers in doubles (the text
-- "1:<A>:<B>:<C>" of earlier versions is read too); the sliding window log keeps a sorted set with one
-- member per admitted unit, scored by its instant in quanta. Anything else
-- found under a key (another type, another format, numbers out of range) is
-- deleted and counted as corrupt. The ranges: an instant (B of the buckets,
-- A of the others, a log entry's score) is in [0, 2^53), for the scripts
-- take Redis' clock for an instant before the epoch; a count or debt (A of
-- the buckets, B of the others, C of the sliding window counter) is in
-- [0, 2^51], for no limit the store accepts counts beyond
-- algorithm.MaxExact; the C of the other algorithms is 0.

local floor, max = math.floor, math.max
local fmt = string.format

local TOKEN, LEAKY, FIXED, LOG, COUNTER, GCRA = 1, 2, 3, 4, 5, 6
local ALLOWED, LIMITED, COST_EXCEEDS, DENY_ALL = 0, 1, 2, 3
local LIMIT = 9007199254740992 -- 2^53: larger numbers are not exact
local EXACT = 2251799813685248 -- 2^51, algorithm.MaxExact: above any count

-- idiv returns floor(a / b) exactly for integers |a| < 2^53 and b > 0.
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- cdiv is algorithm.ceilDiv: a / b rounded up, a >= 0, b > 0.
local function cdiv(a, b)
  return idiv(a + b - 1, b)
end

-- imod is algorithm.floorMod: a mod b in [0, b).
local function imod(a, b)
  return a - idiv(a, b) * b
end

local function int(x)
  return fmt('%.0f', x)
end

local n = #KEYS
local mode = tonumber(ARGV[1])
if mode == 2 then
  n = n - 1
end
local margin = tonumber(ARGV[2])
local corrupt = 0

local clock -- Redis' TIME in µs, read once
-- now_of returns the instant of a request's argument v and the instant its
-- keys expire from: v itself, or for v < 0 Redis' clock plus -1 - v µs
-- and Redis' clock.
local function now_of(v)
  if v >= 0 then
    return v, v
  end
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock - 1 - v, clock
end

local function reset_corrupt(key)
  redis.call('DEL', key)
  corrupt = corrupt + 1
end

-- load returns the State of key for algorithm alg, or the zero state when
-- the key is absent or corrupt (and then deletes it): see the ranges above.
-- For a fixed window it returns too what else the key holds, as
-- checkeach.lua's write takes it: nil nothing, true a string of the
-- layout of earlier versions, or the field of the window read.
local function load(key, alg)
  if alg == FIXED then
    -- a hash of one field, the window's start, holding its count
    local ok, h = pcall(redis.call, 'HGETALL', key)
    if ok then
      if #h == 0 then
        return 0, 0, 0
      end
      if #h > 2 then
        -- several windows: a plain HINCRBY's first count not yet settled
        -- (plain.go); the latest counts, the earlier are deleted
        local best, at = 1, tonumber(h[1])
        for j = 3, #h, 2 do
          local x = tonumber(h[j])
          if x and at and x > at then
            best, at = j, x
          elseif not x then
            at = nil
          end
        end
        if at then
          for j = 1, #h, 2 do
            if j ~= best then
              redis.call('HDEL', key, h[j])
            end
          end
          h = { h[best], h[best + 1] }
        end
      end
      local a, b = tonumber(h[1]), tonumber(h[2])
      if #h ~= 2 or not a or not b or not (a >= 0 and b >= 0 and a == floor(a) and b == floor(b))
        or a >= LIMIT or b > EXACT then
        reset_corrupt(key)
        return 0, 0, 0
      end
      return a, b, 0, h[1]
    end
    -- another type: a string of the layout of earlier versions, kept
    -- until it is written, or corrupt (deleted)
    local before = corrupt
    local a, b, c = load(key, 0)
    if corrupt == before then
      return a, b, c, true
    end
    return 0, 0, 0
  end
  local ok, v = pcall(redis.call, 'GET', key)
  if not ok then
    reset_corrupt(key)
    return 0, 0, 0
  end
  if not v then
    return 0, 0, 0
  end
  local a, b, c
  if #v == 25 and string.byte(v) == 2 then
    local _
    _, a, b, c = struct.unpack('<Bddd', v)
  else
    a, b, c = string.match(v, '^1:(%d+):(%d+):(%d+)$')
    a, b, c = tonumber(a), tonumber(b), tonumber(c)
  end
  if not a or not b or not c then
    reset_corrupt(key)
    return 0, 0, 0
  end
  local at, count = a, b
  if alg == TOKEN or alg == LEAKY then
    at, count = b, a
  end
  if not (a >= 0 and b >= 0 and c >= 0 and a == floor(a) and b == floor(b) and c == floor(c))
    or at >= LIMIT or count > EXACT or c > EXACT or (c ~= 0 and alg ~= COUNTER) then
    reset_corrupt(key)
    return 0, 0, 0
  end
  return a, b, c
end

-- drain_time is algorithm.drainTime.
local function drain_time(debt, N, lag)
  if debt <= 0 then
    return 0
  end
  return cdiv(debt, N) + lag
end

-- bucket_decide is algorithm.bucketDecide: the debt after the request and
-- the decision.
local function bucket_decide(N, K, W, debt, cost, lag)
  local capacity = K * W
  local nxt = debt + cost * W
  if cost > 0 and nxt > capacity then
    return debt, 0, LIMITED, idiv(max(capacity - debt, 0), W), drain_time(debt, N, lag), cdiv(nxt - capacity, N) + lag
  end
  return nxt, 1, ALLOWED, idiv(max(capacity - nxt, 0), W), drain_time(nxt, N, lag), 0
end

-- drain is algorithm.drain.
local function drain(debt, elapsed, rate)
  if elapsed <= 0 or debt <= 0 then
    return max(debt, 0)
  end
  if elapsed >= cdiv(debt, rate) then
    return 0
  end
  return debt - elapsed * rate
end

-- counter_reset and counter_retry are algorithm.counterReset and
-- algorithm.counterRetry.
local function counter_reset(w, e, cur, prev, lag)
  if cur > 0 then
    return 2 * w - e + lag
  elseif prev > 0 then
    return w - e + lag
  end
  return 0
end

local function counter_retry(limit, w, e, cur, prev, cost)
  local free = limit - cur - cost
  if free >= 0 then
    return max(w - e - idiv(free * w, prev), 1)
  end
  local e2 = max(w - idiv((limit - cost) * w, cur), 0)
  return w - e + e2
end

-- apply is algorithm.Apply after the precheck, at t in quanta. It returns
-- the new state (a, b, c) and the decision (allowed, reason, remaining,
-- reset, retry).
local function apply(alg, N, K, W, a, b, c, t, cost, refused)
  if alg == TOKEN or alg == LEAKY then
    local debt = drain(a, t - b, N)
    local last = max(b, t)
    local nd, ok, reason, rem, reset, retry = bucket_decide(N, K, W, debt, cost, last - t)
    return nd, last, 0, ok, reason, rem, reset, retry
  elseif alg == GCRA then
    local full = idiv(K * W, N)
    local debt, lag = 0, 0
    if a > t + full then
      lag = a - t - full - 1
      debt = (full + 1) * N + math.min(b, N)
    elseif a >= t then
      debt = (a - t) * N + math.min(b, N)
    end
    local nd, ok, reason, rem, reset, retry = bucket_decide(N, K, W, debt, cost, lag)
    local q = idiv(nd, N)
    return t + q, nd - q * N, 0, ok, reason, rem, reset, retry
  elseif alg == FIXED then
    local start = t - imod(t, W)
    local count = b
    if a ~= start then
      count = 0
      if a > start then
        start, count = a, b
      end
    end
    local e = start + W
    if cost > 0 and count + cost > N or refused and count > N then
      if refused and cost > 0 then
        -- count_refused: refused, and counted all the same
        if cost > K then
          return start, math.min(count + cost, EXACT), 0, 0, COST_EXCEEDS, 0, e - t, 0
        end
        return start, math.min(count + cost, EXACT), 0, 0, LIMITED, 0, e - t, e - t
      end
      return a, b, c, 0, LIMITED, max(N - count, 0), e - t, e - t
    end
    count = count + cost
    local reset = 0
    if count > 0 then
      reset = e - t
    end
    return start, count, 0, 1, ALLOWED, max(N - count, 0), reset, 0
  elseif alg == COUNTER then
    local w = W
    local start = t - imod(t, w)
    local cur, prev = b, c
    if a == start then
      -- the current window
    elseif a == start - w then
      cur, prev = 0, b
    elseif a > start then
      start = a
    else
      cur, prev = 0, 0
    end
    local e = max(t - start, 0)
    local lag = max(start - t, 0)
    local weighted = prev * (w - e) + cur * w
    local room = N * w - weighted
    if cost > 0 and (cur + cost) * w > N * w - prev * (w - e) then
      return a, b, c, 0, LIMITED, max(idiv(room, w), 0), counter_reset(w, e, cur, prev, lag), counter_retry(N, w, e, cur, prev, cost) + lag
    end
    cur = cur + cost
    return start, cur, prev, 1, ALLOWED, idiv(max(room - cost * w, 0), w), counter_reset(w, e, cur, prev, lag), 0
  end
  return a, b, c, 0, LIMITED, 0, 0, 0
end

-- expires_at is algorithm.ExpiresAt in quanta (nil: the state is the zero
-- state); E is the expiry limit.
local function expires_at(alg, E, W, a, b, c)
  if alg == TOKEN or alg == LEAKY then
    if a <= 0 then
      return nil
    end
    return b + cdiv(a, E)
  elseif alg == GCRA then
    if b > 0 then
      return a + 1
    end
    return a
  elseif alg == FIXED then
    if b == 0 then
      return nil
    end
    return a + W
  elseif alg == COUNTER then
    if b > 0 then
      return a + 2 * W
    elseif c > 0 then
      return a + W
    end
    return nil
  end
  return nil
end

-- ttl returns the time to live in ms of a state that expires at exp quanta,
-- counted from now µs, as an integer string: Redis writes a number of 17
-- digits or more in exponent notation, which PX refuses, and a bucket of a
-- very large burst lives that long.
local function ttl(exp, Q, now)
  local ms = cdiv(max(exp * Q - now, 0), 1000)
  return int(max(ms, 1) + margin)
end

-- The working state of each key touched by the batch:
--   { a, b, c } for the state algorithms, with dirty set when changed;
--   { log = true, stale = , n = , pend = { {score, count}, ... }, cut = }
--   for the log, where cut is the latest t - W of the requests admitted:
--   ApplyLog dropped the entries at or before it from the log.
local work = {}

-- Sliding window log.

-- log_open returns the working log of key at t, counting its entries
-- within (max(t - W, cut), +inf).
local function log_open(key, t, W)
  local w = work[key]
  if not w or not w.log then
    local ok, card = pcall(redis.call, 'ZCARD', key)
    if not ok then
      reset_corrupt(key)
      card = 0
    end
    w = { log = true, card = card, pend = {} }
    work[key] = w
  end
  -- entries at or before t - W have left the window, and those at or
  -- before cut have left the log
  local cut = t - W
  if w.cut and w.cut > cut then
    cut = w.cut
  end
  local stale = 0
  if w.card > 0 then
    stale = redis.call('ZCOUNT', key, '-inf', int(cut))
  end
  local pn = 0
  local pstale = 0
  for _, p in ipairs(w.pend) do
    pn = pn + p[2]
    if p[1] <= cut then
      pstale = pstale + p[2]
    end
  end
  w.stale = stale
  w.live = w.card - stale + pn - pstale
  w.pstale = pstale
  return w
end

-- log_at returns the i-th (0-based) live entry of the working log w, or
-- nil when the entry in Redis is not one the store writes (an instant that
-- is not a whole number of quanta, before the epoch or from 2^53): the log
-- is corrupt.
local function log_at(key, w, i)
  local inredis = w.card - w.stale
  if i < inredis then
    local r = redis.call('ZRANGE', key, w.stale + i, w.stale + i, 'WITHSCORES')
    local v = tonumber(r[2])
    if not v or v ~= floor(v) or v >= LIMIT or v < 0 then
      return nil
    end
    return v
  end
  i = i - inredis + w.pstale
  for _, p in ipairs(w.pend) do
    if i < p[2] then
      return p[1]
    end
    i = i - p[2]
  end
  return 0
end

-- apply_log is algorithm.ApplyLog after the precheck.
local function apply_log(key, r, t)
  local N, W, cost = r.N, r.W, r.cost
  local w = log_open(key, t, W)
  local n = w.live
  -- The newest entry is read on every path that finds one: an entry the
  -- store does not write (see log_at) is the newest when there is one, so
  -- a corrupt log is found before it decides anything.
  local newest
  if n > 0 then
    newest = log_at(key, w, n - 1)
    if not newest then
      reset_corrupt(key)
      w.card, w.stale = 0, 0
      return apply_log(key, r, t)
    end
  end
  if cost > 0 and n + cost > N then
    local oldest = log_at(key, w, n + cost - N - 1)
    if not oldest then
      reset_corrupt(key)
      w.card, w.stale = 0, 0
      return apply_log(key, r, t)
    end
    return 0, LIMITED, max(N - n, 0), newest + W - t, oldest + W - t
  end
  if cost == 0 then
    local reset = 0
    if n > 0 then
      reset = newest + W - t
    end
    return 1, ALLOWED, max(N - n, 0), reset, 0
  end
  if n > 0 then
    newest = max(newest, t)
  else
    newest = t
  end
  table.insert(w.pend, { newest, cost })
  if not w.cut or t - W > w.cut then
    w.cut = t - W
  end
  w.dirty, w.W, w.Q, w.base = true, W, r.Q, r.base
  return 1, ALLOWED, N - n - cost, newest + W - t, 0
end

-- Requests.

local reqs = {}
for i = 1, n do
  local o = 3 + (i - 1) * 9
  reqs[i] = {
    alg = tonumber(ARGV[o + 1]),
    N = tonumber(ARGV[o + 2]),
    K = tonumber(ARGV[o + 3]),
    W = tonumber(ARGV[o + 4]),
    Q = tonumber(ARGV[o + 5]),
    deny = ARGV[o + 6] == '1',
    refused = ARGV[o + 6] == '2',
    E = tonumber(ARGV[o + 7]),
    cost = tonumber(ARGV[o + 8]),
    now = tonumber(ARGV[o + 9]),
  }
  if reqs[i].E == 0 then
    reqs[i].E = reqs[i].N
  end
end

-- decide decides request i against the working state; it returns the
-- decision and whether the state changed.
local function decide(i)
  local r = reqs[i]
  if r.deny then
    return 0, DENY_ALL, 0, 0, 0
  end
  if r.cost > r.K and not r.refused then
    -- Never admitted: the key as it stands, as a read reports it.
    local cost = r.cost
    r.cost = 0
    local _, _, rem, reset = decide(i)
    r.cost = cost
    return 0, COST_EXCEEDS, rem, reset, 0
  end
  local key = KEYS[i]
  r.nowus, r.base = now_of(r.now)
  local t = idiv(r.nowus, r.Q)
  if r.alg == LOG then
    return apply_log(key, r, t)
  end
  local w = work[key]
  if not w or w.log then
    local a, b, c, held = load(key, r.alg)
    w = { a, b, c, held = held }
    work[key] = w
  end
  local a, b, c, ok, reason, rem, reset, retry = apply(r.alg, r.N, r.K, r.W, w[1], w[2], w[3], t, r.cost, r.refused)
  -- (a refusal counted under count_refused is kept only by a check of
  -- each request on its own: all or nothing consumes nothing)
  if r.cost > 0 and (ok == 1 or r.refused and mode == 0) then
    w[1], w[2], w[3] = a, b, c
    w.dirty, w.r = true, r
  end
  return ok, reason, rem, reset, retry
end

-- commit writes the working state of every changed key.
local function commit()
  for key, w in pairs(work) do
    if w.dirty then
      if w.log then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', int(w.cut))
        local newest = 0
        for _, p in ipairs(w.pend) do
          -- (entries a later request of the batch dropped are not written)
          if p[1] > w.cut then
            local s = int(p[1])
            local base = redis.call('ZCOUNT', key, s, s)
            local args = {}
            for k = 1, p[2] do
              args[#args + 1] = s
              args[#args + 1] = s .. ':' .. (base + k)
            end
            -- ZADD takes at most a few thousand pairs at a time comfortably
            local step = 2000
            for j = 1, #args, step do
              redis.call('ZADD', key, unpack(args, j, math.min(j + step - 1, #args)))
            end
          end
          newest = max(newest, p[1])
        end
        redis.call('PEXPIRE', key, ttl(newest + w.W, w.Q, w.base))
        w.card = redis.call('ZCARD', key)
        w.pend = {}
      else
        local r = w.r
        local exp = expires_at(r.alg, r.E, r.W, w[1], w[2], w[3])
        if exp and r.alg == FIXED and w[1] * r.Q > now_of(-1) then
          -- a window that starts after Redis' clock (a request ahead of
          -- it): the 25-byte string, on which a plain HINCRBY (plain.go)
          -- fails, so that checks at Redis' clock come to a script
          redis.call('SET', key, struct.pack('<Bddd', 2, w[1], w[2], 0), 'PX', ttl(exp, r.Q, r.base))
          w.held = true
        elseif exp and r.alg == FIXED then
          -- a hash of one field (see load); never deleted before it is
          -- written but to replace the layout of earlier versions
          local field = int(w[1])
          if w.held == true then
            redis.call('DEL', key)
          end
          redis.call('HSET', key, field, int(w[2]))
          if w.held and w.held ~= true and w.held ~= field then
            redis.call('HDEL', key, w.held)
          end
          w.held = field
          redis.call('PEXPIRE', key, ttl(exp, r.Q, r.base))
        elseif exp then
          redis.call('SET', key, struct.pack('<Bddd', 2, w[1], w[2], w[3]), 'PX', ttl(exp, r.Q, r.base))
        else
          redis.call('DEL', key)
        end
      end
      w.dirty = false
    end
  end
end

local out = { 0, 0 }

if mode == 2 then
  local idem = KEYS[n + 1]
  local ok, rec = pcall(redis.call, 'GET', idem)
  if ok and rec then
    -- A record is 5 whole numbers per request, separated by commas; one
    -- that is not is unreadable as a whole, and decided anew.
    local vals = {}
    for v in string.gmatch(rec .. ',', '([^,]*),') do
      local x = string.match(v, '^%-?%d+$') and tonumber(v)
      if not x or x >= LIMIT or x <= -LIMIT then
        vals = nil
        break
      end
      vals[#vals + 1] = x
    end
    if vals and #vals == 5 * n then
      for k = 1, #vals do
        out[2 + k] = vals[k]
      end
      out[2] = 1
      return out
    end
  end
end

local all = true
for i = 1, n do
  local ok, reason, rem, reset, retry = decide(i)
  local o = 2 + (i - 1) * 5
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = ok, reason, rem, reset, retry
  if ok == 0 then
    all = false
  end
  if mode == 0 then
    commit()
  end
end

if mode == 1 or mode == 2 then
  if all then
    commit()
  end
end
if mode == 3 or ((mode == 1 or mode == 2) and not all) then
  do
    -- Nothing is consumed: every request that alone would have been
    -- admitted reports its key as it stands, limited, without a retry. (A
    -- probe reports so even when all are admitted, still marked admitted.)
    work = {}
    for i = 1, n do
      local o = 2 + (i - 1) * 5
      if out[o + 1] == 1 then
        local r = reqs[i]
        local cost = r.cost
        r.cost = 0
        local _, _, rem, reset = decide(i)
        r.cost = cost
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = 1, LIMITED, rem, reset, 0
        if mode ~= 3 then
          out[o + 1] = 0
        end
      end
    end
  end
end

if mode == 2 then
  local vals = {}
  for k = 3, #out do
    vals[#vals + 1] = int(out[k])
  end
  redis.call('SET', KEYS[n + 1], table.concat(vals, ','), 'PX', tonumber(ARGV[3]))
end

out[1] = corrupt
return out
