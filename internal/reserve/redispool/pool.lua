-- pool.lua: one pool of reservations in Redis, and the transitions of
-- package reservation ported to Lua, integer for integer. Each script of
-- an operation (reserve.lua, get.lua, use.lua, release.lua, sweep.lua,
-- peek.lua) is this file followed by its own; Redis runs it as one atomic
-- step, so nothing interleaves with a transition.
--
-- Every number is an integer below 2^51 (package reservation bounds them
-- so), which Lua's doubles hold exactly; records are kept as MessagePack,
-- which carries them exactly too (tostring and '..' would round them to
-- 14 digits, so numbers are never formatted but with '%d').
--
-- Keys, all with the pool's handle as hash tag (one slot on a cluster):
--   KEYS[1] pool    hash: 'st' = {held, virtual, last_id, now},
--                         'cf' = {capacity, queue_limit, aging, max_duration,
--                                 default weight, guarantee, burst,
--                                 number of named quotas},
--                         'sig' (the configuration as Reserve last gave it),
--                         'rule', 'res',
--                         'q' = the queue, {id, client, tokens, duration,
--                               priority, enqueued, start, finish, secret}
--                               for each request, in ID order,
--                         'c:<client>' = {finish, held, queued},
--                         'w:<client>' = {weight, guarantee, burst}
--   KEYS[2] granted hash: secret -> {id, client, tokens, balance, in_use,
--                                 granted_at, expires_at, released}
--   KEYS[3] expiry  sorted set: granted secrets by expires_at
-- A reservation is known by its secret (the end of its public ID); its
-- numeric ID orders the queue. A pool left idle (nothing held, queued or
-- granted) is deleted: it is the same as a pool never used. Few keys and
-- few commands: each redis.call costs a script about a microsecond.
--
-- ARGV[1] is the instant in µs since the epoch, or -1 for the server's
-- clock. A pool's time never goes back: a call is decided at the latest
-- instant the pool has seen, so instances whose clocks differ a little
-- cannot undo an expiry.
--
-- Every reply begins with the same head, then the operation's own values:
--   code, rule, resource, queue length,
--   #expired, {secret, client, returned} each,
--   #granted, {secret, client, tokens, expires_at} each
-- Codes: 0 done, 1 invalid (then field, reason), 2 queue full, 3 not found,
-- 4 insufficient, 5 not queued, 6 not granted, 7 forbidden.

local OK, INVALID, QUEUE_FULL, NOT_FOUND, INSUFFICIENT, NOT_QUEUED, NOT_GRANTED, FORBIDDEN = 0, 1, 2, 3, 4, 5, 6, 7
local VIRTUAL_SCALE = 720720
local REBASE_AT = 2 ^ 44
local BATCH = 1000 -- the most arguments of one command built from a list
local pack, mp_unpack, unpack_list = cmsgpack.pack, cmsgpack.unpack, unpack
local floor, max, min = math.floor, math.max, math.min

local K_POOL, K_GRANTED, K_EXPIRY = KEYS[1], KEYS[2], KEYS[3]

-- The pool's state (S), configuration (C), names, the signature of its
-- configuration and its queue (Q), read in one command.
local S, C, RULE, RES, SIG
local Q = {}
local exists = false
do
  local v = redis.call('HMGET', K_POOL, 'st', 'cf', 'rule', 'res', 'sig', 'q')
  if v[1] then
    exists = true
    local held, virtual, last, now = mp_unpack(v[1])
    S = {held = held, virtual = virtual, last = last, now = now}
  else
    S = {held = 0, virtual = 0, last = 0, now = 0}
  end
  if v[2] then
    local cap, ql, aging, maxd, dw, dg, db, nq = mp_unpack(v[2])
    C = {cap = cap, qlimit = ql, aging = aging, maxdur = maxd, dw = dw, dg = dg, db = db, nq = nq}
  end
  RULE, RES, SIG = v[3] or '', v[4] or '', v[5]
  if v[6] then
    local f = mp_unpack(v[6])
    for i = 1, #f, 9 do
      Q[#Q + 1] = {id = f[i], client = f[i + 1], tokens = f[i + 2], duration = f[i + 3], priority = f[i + 4],
        enqueued = f[i + 5], start = f[i + 6], finish = f[i + 7], secret = f[i + 8]}
    end
  end
end
local qdirty = false -- the queue is to be written back

-- now is the instant of the call, never before the pool's last one.
local function clock(arg)
  local t = tonumber(arg)
  if t < 0 then
    local tm = redis.call('TIME')
    t = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  end
  S.now = max(S.now, t)
  return S.now
end

-- fieldsWith returns the pool's fields that begin with prefix.
local function fieldsWith(prefix)
  local out = {}
  local all = redis.call('HKEYS', K_POOL)
  for i = 1, #all do
    if string.sub(all[i], 1, #prefix) == prefix then out[#out + 1] = all[i] end
  end
  return out
end

-- hdel deletes the fields of key, BATCH a command.
local function hdel(key, fields)
  for i = 1, #fields, BATCH do
    redis.call('HDEL', key, unpack_list(fields, i, min(i + BATCH - 1, #fields)))
  end
end

-- hset sets the fields and values of the list set in key, BATCH pairs a
-- command.
local function hset(key, set)
  for i = 1, #set, 2 * BATCH do
    redis.call('HSET', key, unpack_list(set, i, min(i + 2 * BATCH - 1, #set)))
  end
end

-- Quotas, with their zero fields filled in (reservation.Config.quota).
local quotas = {}
local function quota(name)
  local q = quotas[name]
  if q == nil then
    local raw = C.nq > 0 and redis.call('HGET', K_POOL, 'w:' .. name)
    local w, g, b
    if raw then w, g, b = mp_unpack(raw) else w, g, b = C.dw, C.dg, C.db end
    if b == 0 then b = C.cap end
    q = {w = max(w, 1), g = g, b = b}
    quotas[name] = q
  end
  return q
end

-- Clients, read when first needed and written back by save(). A client
-- gone is as never seen; cleared is set when the pool forgot them all.
-- stored names the clients read from Redis, which a gone one must leave.
local clients, stored, cleared = {}, {}, false
local function client(name)
  local c = clients[name]
  if c == nil then
    local raw = (not cleared) and redis.call('HGET', K_POOL, 'c:' .. name)
    if raw then
      local f, h, q = mp_unpack(raw)
      c = {finish = f, held = h, queued = q}
      stored[name] = true
    else
      c = {finish = 0, held = 0, queued = 0, gone = true}
    end
    clients[name] = c
  end
  return c
end

-- forget drops a client with nothing in the pool and its finish tag
-- behind the virtual time: it is the same as never seen.
local function forget(name)
  local c = client(name)
  if c.held == 0 and c.queued == 0 and c.finish <= S.virtual then
    clients[name] = {finish = 0, held = 0, queued = 0, gone = true}
  end
end

-- give returns n tokens held by name to the pool.
local function give(name, n)
  S.held = S.held - n
  local c = client(name)
  c.held = c.held - n
  c.gone = false
  forget(name)
end

local function queuedAt(secret)
  for i = 1, #Q do
    if Q[i].secret == secret then return i end
  end
  return nil
end

-- Granted reservations, read by secret and kept for the call (false:
-- none).
local granted_by = {}
local function decode(secret, raw)
  local id, cl, tok, bal, use, gat, exp, rel = mp_unpack(raw)
  return {id = id, client = cl, tokens = tok, balance = bal, inuse = use,
    granted_at = gat, expires_at = exp, released = rel, secret = secret}
end

local function getGranted(secret)
  local r = granted_by[secret]
  if r ~= nil then return r or nil end
  local raw = redis.call('HGET', K_GRANTED, secret)
  if raw then r = decode(secret, raw) end
  granted_by[secret] = r or false
  return r
end

local function putGranted(r)
  granted_by[r.secret] = r
  redis.call('HSET', K_GRANTED, r.secret, pack(r.id, r.client, r.tokens, r.balance, r.inuse,
    r.granted_at, r.expires_at, r.released))
end

-- Effects, in the order they happen.
local expired, granted = {}, {}

-- expire removes the reservations whose expires_at <= now and returns
-- what they hold, balance and tokens in use.
local function expire(now)
  local due = redis.call('ZRANGEBYSCORE', K_EXPIRY, '-inf', now)
  for i = 1, #due, BATCH do
    local j = min(i + BATCH - 1, #due)
    local raws = redis.call('HMGET', K_GRANTED, unpack_list(due, i, j))
    for k = 1, #raws do
      local r = decode(due[i + k - 1], raws[k])
      granted_by[r.secret] = false
      give(r.client, r.balance + r.inuse)
      expired[#expired + 1] = {r.secret, r.client, r.balance + r.inuse}
    end
  end
  if #due > 0 then
    hdel(K_GRANTED, due)
    redis.call('ZREMRANGEBYSCORE', K_EXPIRY, '-inf', now)
  end
end

-- order returns the key of request r at now, smaller first: the tier
-- (0 overdue, 1 within the guarantee, 2 + effective class), the tag (the
-- deadline for the overdue, else the finish tag) and the ID.
local function order(r, now, held)
  local k = r.priority - 1
  local aged = floor(max(now - r.enqueued, 0) / C.aging)
  if aged > k then return 0, r.enqueued + (k + 1) * C.aging, r.id end
  if held + r.tokens <= quota(r.client).g then return 1, r.finish, r.id end
  return 2 + k - aged, r.finish, r.id
end

local function less(a1, a2, a3, b1, b2, b3)
  if a1 ~= b1 then return a1 < b1 end
  if a2 ~= b2 then return a2 < b2 end
  return a3 < b3
end

-- rebase shifts every tag down by the virtual time.
local function rebase()
  local v = S.virtual
  S.virtual = 0
  if not cleared then
    local all = fieldsWith('c:')
    for i = 1, #all do client(string.sub(all[i], 3)) end
  end
  for _, c in pairs(clients) do
    if not c.gone then c.finish = c.finish - v end
  end
  for i = 1, #Q do
    Q[i].start, Q[i].finish = Q[i].start - v, Q[i].finish - v
  end
  qdirty = true
end

-- grant grants from the queue at now: the first eligible request of the
-- order, while it fits in the free tokens. A pool left idle forgets its
-- virtual time and its clients.
local function grant(now)
  while true do
    local best, b1, b2, b3
    for i = 1, #Q do
      local r = Q[i]
      local held = client(r.client).held
      if held + r.tokens <= quota(r.client).b then
        local k1, k2, k3 = order(r, now, held)
        if best == nil or less(k1, k2, k3, b1, b2, b3) then best, b1, b2, b3 = i, k1, k2, k3 end
      end
    end
    if best == nil or Q[best].tokens > C.cap - S.held then
      if S.held == 0 and #Q == 0 and redis.call('ZCARD', K_EXPIRY) == 0 then
        S.virtual, clients, cleared = 0, {}, true
      end
      return
    end
    local r = table.remove(Q, best)
    qdirty = true
    local c = client(r.client)
    c.held, c.queued, c.gone = c.held + r.tokens, c.queued - 1, false
    S.held = S.held + r.tokens
    S.virtual = max(S.virtual, r.start)
    local exp = now + r.duration
    putGranted({id = r.id, client = r.client, tokens = r.tokens, balance = r.tokens, inuse = 0,
      granted_at = now, expires_at = exp, released = false, secret = r.secret})
    redis.call('ZADD', K_EXPIRY, exp, r.secret)
    granted[#granted + 1] = {r.secret, r.client, r.tokens, exp}
    if S.virtual >= REBASE_AT then rebase() end
  end
end

-- estimate returns the place of queued request secret in the order at now
-- (1 for the head) and an estimate of its grant instant, as
-- reservation.Estimate: the queue served in order, each reservation held
-- to its expiry, each request ahead granted as soon as tokens are back and
-- held for its duration.
local function estimate(now, secret)
  local items = {}
  for i = 1, #Q do
    local r = Q[i]
    local k1, k2, k3 = order(r, now, client(r.client).held)
    items[i] = {k1, k2, k3, r}
  end
  table.sort(items, function(a, b) return less(a[1], a[2], a[3], b[1], b[2], b[3]) end)
  local backs = {}
  local raw = redis.call('HVALS', K_GRANTED)
  for i = 1, #raw do
    local _, _, _, bal, use, _, exp = mp_unpack(raw[i])
    if bal + use > 0 then backs[#backs + 1] = {exp, bal + use} end
  end
  table.sort(backs, function(a, b) return a[1] < b[1] end)
  local free, t, head = C.cap - S.held, now, 1
  for pos = 1, #items do
    local r = items[pos][4]
    while free < r.tokens and head <= #backs do
      free = free + backs[head][2]
      t = max(t, backs[head][1])
      head = head + 1
    end
    if r.secret == secret then return pos, t end
    free = free - r.tokens
    -- Insert its return in order (after the equal instants).
    local at, j = t + r.duration, #backs + 1
    while j > head and backs[j - 1][1] > at do j = j - 1 end
    table.insert(backs, j, {at, r.tokens})
  end
  return 0, now
end

-- save writes the pool back in one command (and one more to drop the
-- clients gone), or deletes it when idle.
local function save()
  if not exists and C == nil then return end
  if S.held == 0 and #Q == 0 and redis.call('ZCARD', K_EXPIRY) == 0 then
    redis.call('DEL', K_POOL, K_GRANTED, K_EXPIRY)
    return
  end
  local set, gone = {'st', pack(S.held, S.virtual, S.last, S.now)}, {}
  if cleared then gone = fieldsWith('c:') end
  for name, c in pairs(clients) do
    if c.gone then
      if stored[name] and not cleared then gone[#gone + 1] = 'c:' .. name end
    else
      set[#set + 1], set[#set + 2] = 'c:' .. name, pack(c.finish, c.held, c.queued)
    end
  end
  if qdirty then
    local f = {}
    for i = 1, #Q do
      local r = Q[i]
      local n = #f
      f[n + 1], f[n + 2], f[n + 3], f[n + 4], f[n + 5] = r.id, r.client, r.tokens, r.duration, r.priority
      f[n + 6], f[n + 7], f[n + 8], f[n + 9] = r.enqueued, r.start, r.finish, r.secret
    end
    set[#set + 1], set[#set + 2] = 'q', pack(f)
  end
  -- Drop the gone first: a client both cleared and seen again is in set.
  if #gone > 0 then hdel(K_POOL, gone) end
  hset(K_POOL, set)
end

-- reply returns the head of every reply followed by the values of rest.
local function reply(code, rest)
  local out = {code, RULE, RES, #Q, #expired}
  for i = 1, #expired do
    local e = expired[i]
    out[#out + 1], out[#out + 2], out[#out + 3] = e[1], e[2], e[3]
  end
  out[#out + 1] = #granted
  for i = 1, #granted do
    local g = granted[i]
    out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = g[1], g[2], g[3], g[4]
  end
  for i = 1, #(rest or {}) do out[#out + 1] = rest[i] end
  return out
end

-- lookup returns nothing when secret names a reservation that holder
-- (or anyone, when holder is empty) may act on, else the refusal: an
-- unknown secret, another holder, a released reservation. A lookup that
-- fails changes nothing.
local function lookup(secret, holder)
  local i = queuedAt(secret)
  local rec
  if i then rec = Q[i] else rec = getGranted(secret) end
  if rec == nil then return NOT_FOUND end
  if holder ~= '' and holder ~= rec.client then return FORBIDDEN end
  if rec.released then return NOT_FOUND end
  return nil
end

-- record returns the values of the record of secret in a reply: found (0
-- or 1), client, queued (0 or 1), position, estimated_at, tokens,
-- balance, in_use, granted_at, expires_at. A released reservation is not
-- found.
local function record(now, secret)
  local i = queuedAt(secret)
  if i then
    local r = Q[i]
    local pos, at = estimate(now, secret)
    return {1, r.client, 1, pos, at, r.tokens, 0, 0, 0, 0}
  end
  local g = getGranted(secret)
  if g == nil or g.released then return {0, '', 0, 0, 0, 0, 0, 0, 0, 0} end
  return {1, g.client, 0, 0, 0, g.tokens, g.balance, g.inuse, g.granted_at, g.expires_at}
end
