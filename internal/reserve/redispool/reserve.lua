-- reserve.lua (after pool.lua): reservation.Reserve.
-- ARGV: now, secret, client, tokens, duration (µs), priority, rule,
-- resource, then the configuration: its signature, capacity, queue limit,
-- aging period, max duration, the default quota (weight, guarantee,
-- burst), the number of named quotas and, for each, name, weight,
-- guarantee, burst.
-- Reply: the head, then granted (0 or 1), position, expires_at,
-- estimated_at; or, when refused as invalid, the field and the reason.

local secret, name = ARGV[2], ARGV[3]
local tokens, duration, priority = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

-- The configuration, taken when it is not the one the pool has.
if SIG ~= ARGV[9] then
  local a = {}
  for i = 10, 17 do a[#a + 1] = tonumber(ARGV[i]) end
  C = {cap = a[1], qlimit = a[2], aging = a[3], maxdur = a[4], dw = a[5], dg = a[6], db = a[7], nq = a[8]}
  RULE, RES = ARGV[7], ARGV[8]
  hdel(K_POOL, fieldsWith('w:'))
  quotas = {}
  local set = {'cf', pack(a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]), 'sig', ARGV[9], 'rule', RULE, 'res', RES}
  for i = 0, a[8] - 1 do
    local j = 18 + 4 * i
    set[#set + 1] = 'w:' .. ARGV[j]
    set[#set + 1] = pack(tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]))
  end
  hset(K_POOL, set)
end

local now = clock(ARGV[1])
expire(now)
-- What was due before this request is served before it is queued.
grant(now)

-- The checks of reservation.Reserve, in its order and with its words.
local q = quota(name)
local maxdur = C.maxdur
if maxdur == 0 then maxdur = 300000000 end
local field, reason
if name == '' then
  field, reason = 'client', 'empty'
elseif tokens <= 0 then
  field, reason = 'tokens', string.format('%d not positive', tokens)
elseif tokens > C.cap then
  field, reason = 'tokens', string.format('%d above the capacity %d', tokens, C.cap)
elseif tokens > q.b then
  field, reason = 'tokens', string.format("%d above the client's max_burst %d", tokens, q.b)
elseif duration <= 0 then
  field, reason = 'duration', string.format('%dµs not positive', duration)
elseif duration > maxdur then
  field, reason = 'duration', string.format('%dµs above %dµs', duration, maxdur)
elseif priority ~= 1 and priority ~= 2 and priority ~= 3 then
  field, reason = 'priority', string.format('unknown priority %d', priority)
elseif #Q >= C.qlimit then
  save()
  return reply(QUEUE_FULL)
end
if field then
  save()
  return reply(INVALID, {field, reason})
end

-- Queue it, with its virtual start and finish tags.
local c = client(name)
local start = max(S.virtual, c.finish)
local finish = start + floor((tokens * VIRTUAL_SCALE + q.w - 1) / q.w)
c.finish, c.queued, c.gone = finish, c.queued + 1, false
S.last = S.last + 1
local id = S.last
Q[#Q + 1] = {id = id, client = name, tokens = tokens, duration = duration, priority = priority,
  enqueued = now, start = start, finish = finish, secret = secret}
qdirty = true
grant(now)

local out
for i = 1, #granted do
  if granted[i][1] == secret then out = {1, 0, granted[i][4], 0} end
end
if out == nil then
  local pos, at = estimate(now, secret)
  out = {0, pos, 0, at}
end
save()
return reply(OK, out)
