-- Sluice: give back the cost of a fixed-window check refused after its
-- plain HINCRBY counted it (see plain.go), so that refusals are not
-- counted. Only a field that still exists is decremented, and a count
-- that would reach 0 or less deletes the field (and the key with its last
-- field): a reset or expiry in between never leaves a negative count, nor
-- a key without a time to live.
--
-- KEYS[1]  the window's key
-- ARGV[1]  the window's field
-- ARGV[2]  the cost to give back
local key, field = KEYS[1], ARGV[1]
local v = redis.call('HGET', key, field)
if v then
  local cost = tonumber(ARGV[2])
  if tonumber(v) > cost then
    redis.call('HINCRBY', key, field, -cost)
  else
    redis.call('HDEL', key, field)
  end
end
return 0
