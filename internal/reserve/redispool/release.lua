-- release.lua (after pool.lua): reservation.Cancel of a queued request,
-- or, when it is granted, reservation.Release of its balance (once: the
-- record stays, marked released, until it expires, when what was used
-- returns).
-- ARGV: now, secret, client (the holder, or empty for any).
-- Reply: the head, then 'cancelled', 0, 0, '' or 'released', the tokens
-- returned, how many of the head's grants came before the release, and
-- the holder.

local secret = ARGV[2]
local code = lookup(secret, ARGV[3])
if code then return reply(code) end
local now = clock(ARGV[1])
expire(now)
local i = queuedAt(secret)
if i then
  local r = table.remove(Q, i)
  qdirty = true
  local c = client(r.client)
  c.queued = c.queued - 1
  forget(r.client)
  -- A cancelled head may unblock the ones behind it.
  grant(now)
  save()
  return reply(OK, {'cancelled', 0, 0, ''})
end
local g = getGranted(secret)
grant(now)
if g == nil then
  save()
  return reply(NOT_FOUND)
end
local before = #granted
local returned = g.balance
give(g.client, returned)
g.balance, g.released = 0, true
putGranted(g)
grant(now)
save()
return reply(OK, {'released', returned, before, g.client})
