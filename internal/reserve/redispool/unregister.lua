-- unregister.lua: removes an idle pool from the registry of pools the
-- sweep visits, unless it was registered again since cutoff (a Reserve
-- on another instance): ZREM only if its score is at most the cutoff.
-- KEYS[1]: the registry. ARGV: the pool's handle, the cutoff (s).
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
