-- sweep.lua (after pool.lua): reservation.Expire, for the periodic sweep:
-- expires what is due and grants from the queue.
-- ARGV: now.
-- Reply: the head, then 1 when the pool is idle (and so deleted), else 0.

if not exists then return reply(OK, {1}) end
local now = clock(ARGV[1])
expire(now)
grant(now)
-- Nothing expired and nothing granted: the pool is as it was (and not
-- idle, or the call that left it so would have deleted it); write nothing.
if #expired == 0 and #granted == 0 then return reply(OK, {0}) end
local idle = 0
if S.held == 0 and #Q == 0 and redis.call('ZCARD', K_EXPIRY) == 0 then idle = 1 end
save()
return reply(OK, {idle})
