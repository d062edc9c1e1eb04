-- Sluice: decide checks of the three-integer algorithms (token bucket,
-- leaky bucket, fixed window, sliding window counter, GCRA), each on its
-- own or all or nothing, in one atomic step. It is check.lua's arithmetic for the most common
-- call, written for the least Redis CPU per check: a script's whole body
-- runs on every call, so the checks a server gathers share one call (its
-- cost, the reading of its arguments and of Redis' clock), and each check
-- pays only its commands (a fixed window's HINCRBY; a GET and a write) and
-- a few conversions. The conformance suite holds both scripts to package
-- algorithm.
--
-- Where the Redis CPU goes (docs/redis.md, "Sizing"): per call, the
-- arguments (each a string made by Redis, and tonumber is strtod) and the
-- reply (about as much again per element); per check, its GET and its
-- write. So the parameters and checks come in one binary argument read
-- with struct.unpack, the reply is one binary string, the buckets' and
-- GCRA's checks of distinct keys are read with one MGET, a
-- fixed window counts with one HINCRBY of its window's field (a command
-- that both reads and writes), and the sliding window counter, whose
-- expiry every write of one window shares, overwrites its state in place
-- (SETRANGE, which keeps the time to live) after the first write of a
-- window (SET ... PX, about twice the cost).
--
-- KEYS[i]  the state key of check i; a key that appears twice sees the
--          effect of its first check
-- ARGV[1]  little-endian binary: the expiry margin in milliseconds
--          (double), the number of parameter sets P (uint16), U (uint16),
--          all (byte) and C (double): when U is not 0 every check uses set
--          U at cost C and Redis' clock; when all is 1 the checks are
--          decided all or nothing (their keys must be distinct), when 2
--          each on its own, their keys distinct; then P
--          sets of 7 doubles: algorithm,
--          limit, burst, window, quantum, deny all (0/1; 2: a fixed window
--          counting refused requests), expiry limit
--          (algorithm.Params.ExpiryLimit; 0: the limit); then, when U is
--          0, per check in the order of KEYS its set (1 to P, uint16), its
--          cost and its instant (doubles; the instant in µs since the
--          epoch; -1 - d: Redis TIME plus d µs)
--
-- Reply: a string of little-endian doubles, each an integer: the corrupt
-- keys reset, then per check: remaining x 4 + reason, reset after
-- (quanta), and when the reason is not 0 (admitted) the retry after
-- (quanta); or, for a check admitted by the buckets' and GCRA's common
-- call (below), one negative number, -1 - its debt after (the caller
-- computes the remaining and reset after from it, as decide does).
--
-- All or nothing: every check is decided first and its write held back;
-- the writes are made when every check is admitted. Otherwise nothing is
-- written, and each check that alone would have been admitted is
-- reported as a read of its key (cost 0) would be, with reason 1 and no
-- retry after, as check.lua does. The keys being distinct, no check sees
-- another's effect either way, which is why a batch with a repeated key
-- goes to check.lua.
--
-- State: the 25 bytes struct.pack('<Bddd', 2, A, B, C) (algorithm.State,
-- integers in doubles), and for a fixed window the hash {A: B} (decimal);
-- the text "1:<A>:<B>:<C>" of earlier versions, and the 25 bytes for a
-- fixed window, are read too. The ranges are check.lua's (see its load).
-- The buckets' and GCRA's common call writes struct.pack('<Bddd', 3, A,
-- B, X) instead, X the key's expiry it set (µs, Redis' clock), so that
-- the next checks know whether they may write in place; both scripts
-- read it as (A, B, 0).

local max = math.max
local call, pcall_ = redis.call, redis.pcall
local pack, unpack_, match = struct.pack, struct.unpack, string.match
local LIMIT, EXACT, INT = 9007199254740992, 2251799813685248, 4503599627370496 -- 2^53, 2^51, 2^52

-- idiv returns floor(a / b) exactly for integers |a| < 2^53 and b > 0.
-- (In Redis every call of a C function, math.floor's as string.byte's,
-- costs as much as a few dozen operators: the paths every check takes
-- use operators; q % 1 is q - floor(q), computed in C.)
local function idiv(x, y)
  local q = x / y
  q = q - q % 1
  local r = x - q * y
  if r < 0 then
    q = q - 1
  elseif r >= y then
    q = q + 1
  end
  return q
end

-- The head and the first parameter set (there is always one), read with
-- one struct.unpack: a C call costs Redis about as much as its values.
local args = ARGV[1]
local margin, nsets, U, all, C, alg1, N1, K1, W1, Q1, deny1, E1, pos = unpack_('<dHHBdddddddd', args)
if E1 == 0 then
  E1 = N1
end
local clock -- Redis' TIME in µs, read once

-- The functions below use no local of the script: a closure that does
-- (an upvalue) costs Redis hundreds of instructions a call, even when it
-- is not called. What decide shares with the script is its context cx
-- (see newcx), made on the first check that needs it.

-- newcx returns decide's context: Redis' clock when read already, the
-- expiry margin, whether the call is all or nothing, the corrupt keys
-- reset, idiv and write, and, all or nothing, the writes held back, 6
-- values each (key, new state, time to live in ms or false to keep it,
-- whether it is a fixed window's).
local function newcx(clock, margin, all, idiv, write)
  return { clock = clock, margin = margin, all = all, corrupt = 0, idiv = idiv, write = write, held = {}, nheld = 0 }
end

-- write writes the state (a, b, c) to key with a time to live of px ms,
-- or, when px is false, overwrites its B in place, keeping its time to
-- live. A fixed window's state is the hash {A: B}; fw, false for the
-- other algorithms, says what else the key holds: 1 nothing, true a
-- string (the layout of earlier versions, deleted first), or the field of
-- another window, deleted after. (A key is never deleted before it is
-- written otherwise: in a slot that is moving between Cluster masters, a
-- script may write only keys that are there.)
local function write(key, px, a, b, c, fw)
  local call = redis.call
  if fw then
    if fw == true then
      call('DEL', key)
    end
    local field = string.format('%.0f', a)
    call('HSET', key, field, string.format('%.0f', b))
    if fw ~= 1 and fw ~= true and fw ~= field then
      call('HDEL', key, fw)
    end
    if px then
      call('PEXPIRE', key, px)
    end
  elseif px then
    call('SET', key, struct.pack('<Bddd', 2, a, b, c), 'PX', px)
  else
    -- B alone changes: bytes 9 to 16
    call('SETRANGE', key, '9', struct.pack('<d', b))
  end
end

-- latest returns the field and count of the latest window of a fixed
-- window's hash h (HGETALL) of several fields, and deletes the others:
-- those of earlier windows, left by a plain HINCRBY whose follow-up has
-- not yet run (see plain.go). A field that is not a number returns h,
-- which is then read as corrupt.
local function latest(key, h)
  local best, at = 0, -1
  for j = 1, #h, 2 do
    local x = tonumber(h[j])
    if not x then
      return h
    end
    if x > at then
      best, at = j, x
    end
  end
  for j = 1, #h, 2 do
    if j ~= best then
      call('HDEL', key, h[j])
    end
  end
  return { h[best], h[best + 1] }
end

-- decide decides one check of key with the parameter set ps, writes the
-- key when it is admitted with a positive cost (or refused and counted, in
-- a fixed window counting refused requests), and returns the check's
-- reason, remaining, reset after and retry after. v, when not nil, is
-- what a GET of key answered already (pcall: false, a string or an error).
local function decide(cx, key, ps, cost, now, v)
  local max, call, pcall_ = math.max, redis.call, redis.pcall
  local pack, unpack_, match = struct.pack, struct.unpack, string.match
  local LIMIT, EXACT, INT = 9007199254740992, 2251799813685248, 4503599627370496
  local idiv = cx.idiv
  local alg, N, K, W, Q = ps[1], ps[2], ps[3], ps[4], ps[5]
  if ps[6] then
    return 3, 0, 0, 0
  end
  -- A cost above the capacity is never admitted: it is decided as a read
  -- (cost 0) and reported with reason 2, the key's real remaining and
  -- reset. A fixed window counting refused requests counts it instead.
  local over = 0
  if cost > K and not ps[8] then
    over, cost = 2, 0
  end
  -- base is the instant keys expire from: Redis' clock for an instant
  -- ahead of it (-1 - d: d µs ahead), the instant itself when it is given.
  local base = now
  if now < 0 then
    local clock = cx.clock
    if not clock then
      local tm = call('TIME')
      clock = tm[1] * 1000000 + tm[2]
      cx.clock = clock
    end
    base = clock
    now = clock - 1 - now
  end
  -- t, and the window's start below, are kept in ps for the next check
  -- at the same instant: a Lua function call (idiv) costs Redis as much
  -- as a few dozen operators.
  local t = ps[10]
  if ps[9] ~= now then
    t = idiv(now, Q)
    ps[9], ps[10] = now, t
  end

  -- The state: absent, valid (any layout), or corrupt (reset). A fixed
  -- window's is a hash of one field, the window's start, holding its
  -- count; a string there is the layout of earlier versions, read once.
  local a, b, c = 0, 0, 0
  local bin = false -- the state is in its current layout
  local fw = false -- a fixed window: what else its key holds (see write)
  if alg == 3 then
    fw = 1
    local h = pcall_('HGETALL', key)
    if h.err then
      v = pcall_('GET', key)
      if v then
        fw = true
      end
    elseif #h > 2 then
      h = latest(key, h)
    end
    if h.err then
    elseif #h == 2 then
      a, b, v = tonumber(h[1]), tonumber(h[2]), false
      if a and b then
        bin, fw = true, h[1]
      else
        v = h
      end
    elseif #h > 0 then
      v = h
    else
      v = false
    end
  elseif v == nil then
    v = pcall_('GET', key)
  end
  if bin then
    if not (a >= 0 and b >= 0 and a < LIMIT and b <= EXACT
      and (a >= INT or a + INT - INT == a) and (b >= INT or b + INT - INT == b)) then
      call('DEL', key)
      cx.corrupt = cx.corrupt + 1
      a, b, c, bin, fw = 0, 0, 0, false, 1
    end
  elseif v then
    -- v is a string, or a table for an error (another type), whose
    -- length is 0
    local ok, len, tag = false, #v, nil
    if len == 25 and type(v) == 'string' then
      tag, a, b, c = unpack_('<Bddd', v)
    end
    if tag == 2 then
      ok, bin = true, not fw
    elseif tag == 3 then
      -- a bucket's or GCRA's state and its key's expiry, rewritten whole
      ok, c = true, 0
    elseif len > 0 and type(v) == 'string' then
      local sa, sb, sc = match(v, '^1:(%d+):(%d+):(%d+)$')
      a, b, c = tonumber(sa), tonumber(sb), tonumber(sc)
      ok = a and b and c
    end
    if ok then
      local at, count = a, b
      if alg == 1 or alg == 2 then
        at, count = b, a
      end
      -- x is an integer when x >= 2^52 (every double there is) or
      -- x + 2^52 - 2^52 == x (the sum rounds to an integer): operators,
      -- where x % 1 calls C
      ok = a >= 0 and b >= 0 and c >= 0 and at < LIMIT and count <= EXACT and c <= EXACT
        and (a >= INT or a + INT - INT == a) and (b >= INT or b + INT - INT == b) and c + INT - INT == c
        and (c == 0 or alg == 5)
    end
    if not ok then
      call('DEL', key)
      cx.corrupt = cx.corrupt + 1
      a, b, c, bin = 0, 0, 0, false
      if fw then
        fw = 1
      end
    end
  end

  -- The decision fields (rem, reset; retry on a denial) and the new state
  -- (na, nb, nc), which expires at exp quanta; keep is set when the key
  -- holds the 25-byte layout and its time to live already ends there.
  local na, nb, nc, rem, reset, exp
  local keep = false
  local refused -- a refusal counted all the same: its reason (1 or 2)
  if alg == 3 then
    local start = ps[12]
    if ps[11] ~= t then
      start = idiv(t, W) * W
      ps[11], ps[12] = t, start
    end
    local count = b
    if a ~= start then
      count = 0
      if a > start then -- the clock went back: keep the later window
        start, count = a, b
      end
    end
    local e = start + W
    if cost > 0 and count + cost > N or ps[8] and count > N then
      if not ps[8] or cost == 0 then
        return 1, max(N - count, 0), e - t, e - t
      end
      -- counting refused requests: refused, and counted all the same (up
      -- to 2^51)
      refused = 1
      if cost > K then
        refused = 2
      end
      if count + cost > EXACT then
        cost = EXACT - count
      end
    end
    count = count + cost
    reset = 0
    if count > 0 then
      reset = e - t
    end
    rem = N - count
    if rem < 0 then
      rem = 0
    end
    if cost == 0 and not refused then
      return over, rem, reset, 0
    end
    -- A state of this window with a count expires at its end already.
    keep = bin and a == start and b > 0
    na, nb, nc = start, count, 0
    exp = e
    -- A window that starts after Redis' clock (a request ahead of it) is
    -- written as the 25-byte string, on which a plain HINCRBY (plain.go)
    -- fails: checks at Redis' clock are then decided here, against it.
    local clock = cx.clock
    if not clock then
      local tm = call('TIME')
      clock = tm[1] * 1000000 + tm[2]
      cx.clock = clock
    end
    if start * Q > clock then
      fw, keep = false, false
    end
  elseif alg == 1 or alg == 2 or alg == 6 then
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
        debt = a - t
        if b < N then
          debt = debt * N + b
        else
          debt = debt * N + N
        end
      end
    else
      -- a clock that went back stands still at b, lag quanta from now
      local el = t - b
      if el < 0 then
        lag = -el
      end
      if el <= 0 or a <= 0 then
        debt = a
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
      return 1, idiv(max(cap - debt, 0), W), reset, idiv(nxt - cap + N - 1, N) + lag
    end
    rem, reset = 0, 0
    if nxt < cap then
      rem = idiv(cap - nxt, W)
    end
    if nxt > 0 then
      reset = idiv(nxt + N - 1, N) + lag
    end
    if cost == 0 then
      return over, rem, reset, 0
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
      na, nb, nc = nxt, b, 0
      if t > b then
        nb = t
      end
      exp = nb + idiv(na + E - 1, E)
    end
  elseif alg == 5 then
    local w = W
    local start = ps[12]
    if ps[11] ~= t then
      start = idiv(t, w) * w
      ps[11], ps[12] = t, start
    end
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
    local e, lag = t - start, 0
    if e < 0 then
      -- a clock that went back stands still at start, lag quanta from now
      e, lag = 0, -e
    end
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
      return 1, max(idiv(room, w), 0), rs, rt + lag
    end
    cur = cur + cost
    rem = 0
    if room > cost * w then
      rem = idiv(room - cost * w, w)
    end
    if cur > 0 then
      reset = 2 * w - e + lag
    elseif prev > 0 then
      reset = w - e + lag
    else
      reset = 0
    end
    if cost == 0 then
      return over, rem, reset, 0
    end
    -- A state of this window with a count expires two windows on
    -- already, and its A and C stay.
    keep = bin and a == start and b > 0
    na, nb, nc = start, cur, prev
    exp = start + 2 * w
  else
    return 1, 0, 0, 0
  end

  local px = false
  if not keep then
    px = 1
    if exp * Q > base then
      px = idiv(exp * Q - base + 999, 1000)
    end
    px = px + cx.margin
    if px >= 1e15 then
      -- Redis writes a number of 17 digits or more in exponent notation,
      -- which PX refuses; a bucket of a very large burst lives that long.
      px = string.format('%.0f', px)
    end
  end
  if cx.all == 1 then
    local held, nheld = cx.held, cx.nheld
    held[nheld + 1], held[nheld + 2], held[nheld + 3], held[nheld + 4], held[nheld + 5], held[nheld + 6] = key, px, na, nb, nc, fw
    cx.nheld = nheld + 6
  elseif fw then
    cx.write(key, px, na, nb, nc, fw)
  elseif px then
    call('SET', key, pack('<Bddd', 2, na, nb, nc), 'PX', px)
  else
    call('SETRANGE', key, '9', pack('<d', nb)) -- as write does
  end
  if refused then
    if refused == 1 then
      return 1, 0, reset, reset
    end
    return 2, 0, reset, 0
  end
  return 0, rem, reset, 0
end

-- The most common checks: a fixed window, a sliding window counter or
-- GCRA, every check of the call at one parameter set (set 1), one cost
-- within the capacity and Redis' clock. A fixed window's check is one
-- HINCRBY; a counter's on a key holding counts of the current window that
-- leave room for the cost is counted in place; a GCRA check on a key
-- absent or valid that leaves room is decided inline. Every other check
-- takes decide's general path. fast is set for those calls; fs holds the
-- window's start, fe the quanta elapsed since and ft the instant, in
-- quanta.
local fast, fs, fe, ft = false, 0, 0, 0
if U ~= 0 and all ~= 1 and alg1 ~= 4 and deny1 == 0 and C > 0 and C <= K1 then
  local tm = call('TIME')
  clock = tm[1] * 1000000 + tm[2]
  ft = clock
  if Q1 ~= 1 then
    ft = idiv(clock, Q1)
  end
  fast = true
  if alg1 == 3 or alg1 == 5 then
    fs = idiv(ft, W1) * W1
    fe = ft - fs
  end
end

-- The parameter sets as decide takes them: { algorithm, limit, burst,
-- window, quantum, deny all, expiry limit, counting refused requests,
-- then (see decide) the last instant decided and its t, the last t and
-- its window's start }. The buckets' and GCRA's common call makes set 1
-- only for a check that takes decide's path.
local sets = false
if not fast or alg1 == 3 or alg1 == 5 then
  sets = { { alg1, N1, K1, W1, Q1, deny1 == 1, E1, deny1 == 2, -1, 0, -1, 0 } }
  for k = 2, nsets do
    local alg, N, K, W, Q, deny, E
    alg, N, K, W, Q, deny, E, pos = unpack_('<ddddddd', args, pos)
    if E == 0 then
      E = N
    end
    sets[k] = { alg, N, K, W, Q, deny == 1, E, deny == 2, -1, 0, -1, 0 }
  end
end
-- The reply, sized for 15 admitted checks (31 beyond 10 checks): a table
-- that grows is copied at every power of two, the nils of its constructor
-- make room at once.
local reply, n
if #KEYS <= 10 then
  reply, n = { 0, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }, 1
else
  reply, n = { 0, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
    nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }, 1
end
local denied = false
local first = pos -- the checks, when U is 0

local fN, fW, fwin, fbucket = N1, W1, false, false
-- for the buckets and GCRA: the algorithm, the capacity (K x W), the
-- slowest refill (E, buckets), the cost scaled (C x W), the largest A and
-- B of a valid state (GCRA: A at most the capacity's length, cap / N,
-- ahead; the buckets: B not ahead), the quantum, the expiry margin in
-- µs, and Redis' clock less 1 ms: the instant a key's time to live set
-- now is counted from at the earliest (Redis counts in ms)
local galg, gcap, gE, gcost, gamax, gbmax = 0, 0, 1, 0, 0, 0
local fQ, fmargin, cus = 1, 0, 0
-- for a fixed window: the window's field, the cost as Redis writes it and
-- the time to live of a new window's count (ms)
local ffield, fcost, fpx
if fast then
  fwin = alg1 == 3
  galg = alg1
  if galg == 1 or galg == 2 or galg == 6 then
    fbucket = true
    gcap, gE, gcost = K1 * fW, E1, C * fW
    if galg == 6 then
      gamax, gbmax = ft + idiv(gcap, fN), EXACT
    else
      gamax, gbmax = EXACT, ft
    end
    fQ, fmargin, cus = Q1, margin * 1000, clock - 1000
  end
  if fwin then
    ffield, fcost = string.format('%.0f', fs), string.format('%.0f', C)
    fpx = 1
    if (fs + fW) * Q1 > clock then
      fpx = idiv((fs + fW) * Q1 - clock + 999, 1000)
    end
    fpx = fpx + margin
    if fpx >= 1e15 then
      fpx = string.format('%.0f', fpx)
    end
  end
end

-- decide's context, made now for a call of any other kind
local cx
if not fast then
  cx = newcx(clock, margin, all, idiv, write)
end

if fbucket then
  -- The buckets' and GCRA's common call: a valid or absent state whose
  -- debt leaves room for the cost, the clock not gone back, is decided
  -- inline with decide's arithmetic (a Lua function call costs Redis much,
  -- and every operator some 40 instructions). Its write is in place
  -- (SETRANGE, keeping the time to live) when the key's expiry, which the
  -- state records (layout 3), covers the new state and the margin;
  -- otherwise it sets more than the state needs, so that the next checks
  -- write in place: twice, or, for a key checked again before it expired,
  -- what it needs and a window more. Every other check takes decide's
  -- general path.
  --
  -- Why a key written in place never expires while its state matters:
  -- only this loop writes layout 3, with SET ... PX px and the record
  -- R = cus + px ms, cus being Redis' clock, read first in the call, less
  -- 1 ms; Redis counts px from its own clock in ms at the script's start,
  -- which is at least cus but for the instant the script ran before it
  -- read the clock (the same for every time to live a script sets). So
  -- the key expires at R or later. A write in place keeps the key's
  -- expiry and R, and is made only when the new state, restored at exp,
  -- has exp plus the margin <= R: the key outlives it, by the margin.
  -- Every other write (decide's, check.lua's) is a SET of layout 2, which
  -- sets the expiry its state needs and drops the record.
  local keys = KEYS
  -- Distinct keys are read with one MGET (a command costs Redis much
  -- more than the keys it reads); a key it finds absent, or not a
  -- string, is read again with GET, which tells which, as decide needs.
  local vals = false
  if all == 2 and #keys > 1 then
    vals = call('MGET', unpack(keys))
  end
  for i = 1, #keys do
    local key = keys[i]
    local v = vals and vals[i]
    if not v then
      v = pcall_('GET', key)
    end
    local tag, a, b, c
    if v then
      if #v == 25 then
        tag, a, b, c = unpack_('<Bddd', v)
      end
    else
      tag, a, b, c = 2, 0, 0, 0
    end
    -- GCRA: a the theoretical arrival time, b its part of a quantum in
    -- units of 1/N; the buckets: a the debt, b the instant of the last
    -- update; c the key's expiry (µs, layout 3) or 0. x is an integer
    -- when x + 2^52 - 2^52 == x (the sum rounds to an integer) or x >= 2^52
    -- (every double there is).
    local done = false
    if (tag == 3 or tag == 2 and c == 0) and a >= 0 and b >= 0 and a <= gamax and b <= gbmax
      and (a + INT - INT == a or a >= INT) and (b + INT - INT == b or b >= INT) then
      local debt = 0
      if galg == 6 then
        if a >= ft then
          debt = (a - ft) * fN + b
          if b >= fN then
            debt = (a - ft) * fN + fN
          end
        end
      elseif a > 0 then
        -- drained after el quanta when el x N >= a (exact: a <= 2^51)
        local el = ft - b
        if el == 0 then
          debt = a
        elseif a > el * fN then
          debt = a - el * fN
        end
      end
      local nxt = debt + gcost
      if nxt <= gcap then
        -- q = idiv(nxt, fN) and its remainder r, inline (as idiv
        -- computes them)
        local q = nxt / fN
        q = q - q % 1
        local r = nxt - q * fN
        if r < 0 then
          q, r = q - 1, r + fN
        elseif r >= fN then
          q, r = q + 1, r - fN
        end
        -- reset = ceil(nxt / N)
        local reset = q
        if r > 0 then
          reset = q + 1
        end
        local na, nb, exp
        if galg == 6 then
          na, nb, exp = ft + q, r, ft + reset
        else
          -- the state is gone once drained at the slowest refill
          na, nb, exp = nxt, ft, ft + reset
          if gE ~= fN then
            exp = ft + idiv(nxt + gE - 1, gE)
          end
        end
        -- the instant (µs) the key must outlive
        exp = exp * fQ + fmargin
        if tag == 3 and exp <= c then
          call('SETRANGE', key, '1', pack('<dd', na, nb))
        else
          local px = idiv(exp - clock + 999, 1000) -- ms, at least 1
          local wms = idiv(fW * fQ + 999, 1000)
          if tag == 3 and px < wms then
            px = px + wms
          else
            px = 2 * px
          end
          local st = pack('<Bddd', 3, na, nb, cus + px * 1000)
          if px >= 1e15 then
            px = string.format('%.0f', px) -- as decide does
          end
          call('SET', key, st, 'PX', px)
        end
        -- admitted: the debt after it, from which the caller computes
        -- the remaining (cap - nxt) / W and the reset after ceil(nxt / N)
        n = n + 1
        reply[n] = -1 - nxt
        done = true
      end
    end
    if not done then
      cx = cx or newcx(clock, margin, all, idiv, write)
      sets = sets or { { alg1, N1, K1, W1, Q1, deny1 == 1, E1, deny1 == 2, -1, 0, -1, 0 } }
      local reason, rem, reset, retry = decide(cx, key, sets[1], C, -1, v)
      reply[n + 1], reply[n + 2] = rem * 4 + reason, reset
      n = n + 2
      if reason ~= 0 then
        reply[n + 1] = retry
        n = n + 1
        denied = true
      end
    end
  end
else
  for i = 1, #KEYS do
    local k, cost, now = U, C, -1
    if U == 0 then
      k, cost, now, pos = unpack_('<Hdd', args, pos)
    end
    local key = KEYS[i]
    local reason, rem, reset, retry
    if fwin then
      -- A fixed window counts with one HINCRBY of the window's field. A
      -- count that goes over the limit is taken back (refusals are not
      -- counted); a field it creates gets the window's expiry, unless the key
      -- holds another window too, which, with a key of another type or
      -- layout, decide's general path settles.
      local v = pcall_('HINCRBY', key, ffield, fcost)
      if type(v) == 'number' then
        if v > cost then
          if v <= fN then
            reason, rem, reset, retry = 0, fN - v, fW - fe, 0
          else
            call('HINCRBY', key, ffield, -cost)
            reason, rem, reset, retry = 1, max(fN - v + cost, 0), fW - fe, fW - fe
          end
        elseif v == cost and v <= fN and call('HLEN', key) == 1 then
          call('PEXPIRE', key, fpx)
          reason, rem, reset, retry = 0, fN - v, fW - fe, 0
        elseif v == cost then
          call('HDEL', key, ffield)
        else
          call('HINCRBY', key, ffield, -cost)
        end
      end
      if not reason then
        cx = cx or newcx(clock, margin, all, idiv, write)
        reason, rem, reset, retry = decide(cx, key, sets[1], cost, now)
      end
    elseif fast then
      -- In place when the state is valid as decide would find it (A is fs,
      -- an integer in range; B a positive integer count; C 0 in a fixed
      -- window, the previous window's count in a counter) and leaves room
      -- for the cost. Inline: a Lua function call costs Redis much.
      local v = pcall_('GET', key)
      local tag, a, b, c
      if v and #v == 25 then
        tag, a, b, c = unpack_('<Bddd', v)
      end
      if tag == 2 and a == fs and a < LIMIT and b > 0 and b <= EXACT and b + INT - INT == b then
        if fwin then
          if c == 0 and b + cost <= fN then
            rem, reset = fN - b - cost, fW - fe
          end
        elseif c >= 0 and c <= EXACT and c + INT - INT == c and (b + cost) * fW <= fN * fW - c * (fW - fe) then
          local room = fN * fW - (c * (fW - fe) + b * fW) - cost * fW
          rem, reset = 0, 2 * fW - fe
          if room > 0 then
            rem = idiv(room, fW)
          end
        end
      end
      if rem then
        call('SETRANGE', key, '9', pack('<d', b + cost)) -- as write does
        reason, retry = 0, 0
      else
        cx = cx or newcx(clock, margin, all, idiv, write)
        reason, rem, reset, retry = decide(cx, key, sets[1], cost, now, v)
      end
    else
      reason, rem, reset, retry = decide(cx, key, sets[k], cost, now)
    end
    reply[n + 1], reply[n + 2] = rem * 4 + reason, reset
    n = n + 2
    if reason ~= 0 then
      reply[n + 1] = retry
      n = n + 1
      denied = true
    end
  end
end
if all == 1 then
  if not denied then
    local held = cx.held
    for j = 1, cx.nheld, 6 do
      write(held[j], held[j + 1], held[j + 2], held[j + 3], held[j + 4], held[j + 5])
    end
  else
    -- Nothing is written: the reply is made again, each check that was
    -- admitted reported as a read of its key, limited, without a retry.
    local old, o = reply, 2
    reply, n, pos = { 0 }, 1, first
    for i = 1, #KEYS do
      local k, cost, now = U, C, -1
      if U == 0 then
        k, cost, now, pos = unpack_('<Hdd', args, pos)
      end
      local reason, rem, reset, retry = old[o] % 4, (old[o] - old[o] % 4) / 4, old[o + 1], 0
      o = o + 2
      if reason == 0 then
        reason, rem, reset = decide(cx, KEYS[i], sets[k], 0, now)
        reason = 1
      else
        retry = old[o]
        o = o + 1
      end
      reply[n + 1], reply[n + 2], reply[n + 3] = rem * 4 + reason, reset, retry
      n = n + 3
    end
  end
end
if cx then
  reply[1] = cx.corrupt
end
-- One string of doubles: Redis converts a reply's every element at a cost
-- of hundreds of instructions, and packs a double at a few dozen.
if n <= 4000 then
  return pack('<' .. string.rep('d', n), unpack(reply, 1, n))
end
local parts = {}
for j = 1, n, 4000 do
  local m = math.min(n - j + 1, 4000)
  parts[#parts + 1] = pack('<' .. string.rep('d', m), unpack(reply, j, j + m - 1))
end
return table.concat(parts)
