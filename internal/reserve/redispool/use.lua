-- use.lua (after pool.lua): reservation.Use, n tokens drawn from a
-- granted reservation's balance into use; n = 0 only expires what is due.
-- ARGV: now, secret, client (the holder, or empty for any), n.
-- Reply: the head, then the record after the draw (see record in
-- pool.lua); or, when n is invalid, the field and the reason.

local secret = ARGV[2]
local code = lookup(secret, ARGV[3])
if code then return reply(code) end
local now = clock(ARGV[1])
local n = tonumber(ARGV[4])
expire(now)
local rest
if n ~= 0 then
  local g = getGranted(secret)
  if g == nil then
    if queuedAt(secret) then code = NOT_GRANTED else code = NOT_FOUND end
  elseif n < 0 then
    code, rest = INVALID, {'n', string.format('%d not positive', n)}
  elseif n > g.balance then
    code = INSUFFICIENT
  else
    g.balance, g.inuse = g.balance - n, g.inuse + n
    putGranted(g)
  end
end
grant(now)
if code == nil then
  rest = record(now, secret)
  if rest[1] == 0 then
    code, rest = NOT_FOUND, nil
  elseif rest[3] == 1 then
    code, rest = NOT_GRANTED, nil
  else
    code = OK
  end
end
-- A draw changes the reservation only: the pool is written when the
-- expiries or the grants changed it.
if #expired > 0 or #granted > 0 then save() end
return reply(code, rest)
