-- Sluice: decide checks of the three-integer algorithms (token bucket,
-- leaky bucket, fixed window, sliding window counter, GCRA), each on its
-- own, in one atomic step. It is check.lua's arithmetic for the most common
-- call, written inline: a script's whole body runs on every call, so every
-- function and table it creates is paid per call, and the checks a server
-- gathers share one call (its cost, the reading of its arguments and of
-- Redis' clock). The conformance suite holds both scripts to package
-- algorithm.
--
-- KEYS[i]  the state key of check i; a key that appears twice sees the
--          effect of its first check
-- ARGV     expiry margin (ms), the number of parameter sets P, then 7 per
--          set: algorithm, limit, burst, window, quantum, deny all (0/1;
--          2: a fixed window counting refused requests),
--          expiry limit (algorithm.Params.ExpiryLimit; 0: the limit);
--          then 3 per check: its parameter set (1 to P), cost, now (µs
--          since the epoch; -1: Redis TIME)
--
-- Reply: {corrupt keys reset, 0, then 5 per check: allowed (0/1), reason,
-- remaining, reset after (quanta), retry after (quanta)}, as check.lua's.

local floor, max = math.floor, math.max

-- idiv returns floor(a / b) exactly for integers |a| < 2^53 and b > 0.
local function idiv(x, y)
  local q = floor(x / y)
  local r = x - q * y
  if r < 0 then
    q = q - 1
  elseif r >= y then
    q = q + 1
  end
  return q
end

local margin = tonumber(ARGV[1])
local corrupt = 0
local clock -- Redis' TIME in µs, read once

-- decide decides one check of key with the parameter set ps, writes the
-- key when it is admitted with a positive cost, and returns the check's 5
-- reply values.
local function decide(key, ps, cost, now)
  local alg, N, K, W, Q = ps[1], ps[2], ps[3], ps[4], ps[5]
  if ps[6] then
    return 0, 3, 0, 0, 0
  end
  if cost > K and not ps[8] then
    -- Never admitted: the key as it stands, as a read reports it.
    local _, _, rem, reset = decide(key, ps, 0, now)
    return 0, 2, rem, reset, 0
  end
  if now < 0 then
    if not clock then
      local tm = redis.call('TIME')
      clock = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
    end
    now = clock
  end
  local t = idiv(now, Q)

  local a, b, c = 0, 0, 0
  local ok, v = pcall(redis.call, 'GET', key)
  if not ok then
    redis.call('DEL', key)
    corrupt = corrupt + 1
  elseif v then
    -- the ranges of check.lua's load: no sign, an instant below 2^53, a
    -- count at most 2^51, and a C of 0 but for the sliding window counter
    local sa, sb, sc = string.match(v, '^1:(%d+):(%d+):(%d+)$')
    a, b, c = tonumber(sa), tonumber(sb), tonumber(sc)
    local at, count = a, b
    if alg == 1 or alg == 2 then
      at, count = b, a
    end
    if not a or not b or not c or at >= 9007199254740992 or count > 2251799813685248 or c > 2251799813685248 or (c ~= 0 and alg ~= 5) then
      redis.call('DEL', key)
      corrupt = corrupt + 1
      a, b, c = 0, 0, 0
    end
  end

  local na, nb, nc, rem, reset, exp
  local refused -- count_refused: the reason of a refusal counted all the same
  if alg == 1 or alg == 2 or alg == 6 then
    local cap = K * W
    local debt, lag = 0, 0
    if alg == 6 then
      local full = idiv(cap, N)
      if a > t + full then
        -- a clock that went back, far: decide where the debt is still
        -- above the capacity, lag quanta from now
        lag = a - t - full - 1
        debt = (full + 1) * N + math.min(b, N)
      elseif a >= t then
        debt = (a - t) * N + math.min(b, N)
      end
    else
      -- a clock that went back stands still at b, lag quanta from now
      lag = max(b - t, 0)
      local el = t - b
      if el <= 0 or a <= 0 then
        debt = max(a, 0)
      elseif el >= idiv(a + N - 1, N) then
        debt = 0
      else
        debt = a - el * N
      end
    end
    local nxt = debt + cost * W
    if cost > 0 and nxt > cap then
      reset = 0
      if debt > 0 then
        reset = idiv(debt + N - 1, N) + lag
      end
      return 0, 1, idiv(max(cap - debt, 0), W), reset, idiv(nxt - cap + N - 1, N) + lag
    end
    rem, reset = idiv(max(cap - nxt, 0), W), 0
    if nxt > 0 then
      reset = idiv(nxt + N - 1, N) + lag
    end
    if cost == 0 then
      return 1, 0, rem, reset, 0
    end
    if alg == 6 then
      local q = idiv(nxt, N)
      na, nb, nc = t + q, nxt - q * N, 0
      exp = na
      if nb > 0 then
        exp = exp + 1
      end
    else
      -- the state is gone once drained at the slowest refill sharing it
      local E = ps[7]
      na, nb, nc = nxt, max(b, t), 0
      exp = nb + idiv(na + E - 1, E)
    end
  elseif alg == 3 then
    local start = idiv(t, W) * W
    local count = b
    if a ~= start then
      count = 0
      if a > start then
        start, count = a, b
      end
    end
    local e = start + W
    if cost > 0 and count + cost > N or ps[8] and count > N then
      if not ps[8] or cost == 0 then
        return 0, 1, max(N - count, 0), e - t, e - t
      end
      refused = 1
      if cost > K then
        refused = 2
      end
      cost = math.min(count + cost, 2251799813685248) - count
    end
    count = count + cost
    reset = 0
    if count > 0 then
      reset = e - t
    end
    rem = max(N - count, 0)
    if cost == 0 and not refused then
      return 1, 0, rem, reset, 0
    end
    na, nb, nc = start, count, 0
    exp = start + W
  elseif alg == 5 then
    local w = W
    local start = idiv(t, w) * w
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
    local lag = max(start - t, 0) -- a clock that went back stands still at start
    local room = N * w - (prev * (w - e) + cur * w)
    if cost > 0 and (cur + cost) * w > N * w - prev * (w - e) then
      local rs = 0
      if cur > 0 then
        rs = 2 * w - e + lag
      elseif prev > 0 then
        rs = w - e + lag
      end
      local rt
      local free = N - cur - cost
      if free >= 0 then
        rt = max(w - e - idiv(free * w, prev), 1)
      else
        rt = w - e + max(w - idiv((N - cost) * w, cur), 0)
      end
      return 0, 1, max(idiv(room, w), 0), rs, rt + lag
    end
    cur = cur + cost
    rem = idiv(max(room - cost * w, 0), w)
    if cur > 0 then
      reset = 2 * w - e + lag
    elseif prev > 0 then
      reset = w - e + lag
    else
      reset = 0
    end
    if cost == 0 then
      return 1, 0, rem, reset, 0
    end
    na, nb, nc = start, cur, prev
    exp = start + 2 * w
  else
    return 0, 1, 0, 0, 0
  end

  local px = max(floor((max(exp * Q - now, 0) + 999) / 1000), 1) + margin
  if px >= 1e15 then
    -- Redis writes a number of 17 digits or more in exponent notation,
    -- which PX refuses; a bucket of a very large burst lives that long.
    px = string.format('%.0f', px)
  end
  redis.call('SET', key, string.format('1:%.0f:%.0f:%.0f', na, nb, nc), 'PX', px)
  if refused == 1 then
    return 0, 1, 0, reset, reset
  elseif refused == 2 then
    return 0, 2, 0, reset, 0
  end
  return 1, 0, rem, reset, 0
end

local sets = {}
for s = 1, tonumber(ARGV[2]) do
  local o = 2 + 7 * (s - 1)
  local N, E = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 7])
  if E == 0 then
    E = N
  end
  sets[s] = { tonumber(ARGV[o + 1]), N, tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]),
    tonumber(ARGV[o + 5]), ARGV[o + 6] == '1', E, ARGV[o + 6] == '2' }
end
local reply, n = { 0, 0 }, 2
local o = 2 + 7 * #sets
for i = 1, #KEYS do
  local a, r, rem, reset, retry = decide(KEYS[i], sets[tonumber(ARGV[o + 1])], tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]))
  reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4], reply[n + 5] = a, r, rem, reset, retry
  n, o = n + 5, o + 3
end
reply[1] = corrupt
return reply
