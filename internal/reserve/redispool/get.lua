-- get.lua (after pool.lua): the record of one reservation, after what is
-- due in its pool was expired and granted (reservation.Expire).
-- ARGV: now, secret, client (the holder, or empty for any).
-- Reply: the head, then the record (see record in pool.lua).

local secret = ARGV[2]
local code = lookup(secret, ARGV[3])
if code then return reply(code) end
local now = clock(ARGV[1])
expire(now)
grant(now)
local rec = record(now, secret)
if #expired > 0 or #granted > 0 then save() end
if rec[1] == 0 then return reply(NOT_FOUND) end
return reply(OK, rec)
