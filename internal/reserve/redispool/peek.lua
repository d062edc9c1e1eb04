-- peek.lua (after pool.lua): reads a pool and changes nothing.
-- ARGV: now, client (or empty).
-- Reply: the head, then held, capacity and, for the client's first
-- request queued, its position and estimated grant (0, 0 when none).

if not exists then return reply(OK, {0, 0, 0, 0}) end
local now = clock(ARGV[1])
local pos, at = 0, 0
if ARGV[2] ~= '' then
  for i = 1, #Q do
    if Q[i].client == ARGV[2] then
      pos, at = estimate(now, Q[i].secret)
      break
    end
  end
end
return reply(OK, {S.held, C.cap, pos, at})
