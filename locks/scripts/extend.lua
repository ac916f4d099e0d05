-- KEYS: lock
-- ARGV: token ms replace("1" sets the TTL to ms, "0" adds ms to what is left)
-- -> new pttl_ms | 0 not owned (expired or someone else's: nothing is changed)
local lock, token, ms, replace = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('HGET', lock, 'token') ~= token then return 0 end
local left = redis.call('PTTL', lock)
if left < 0 then return 0 end
local new = ms
if replace ~= '1' then new = left + ms end
redis.call('PEXPIRE', lock, new)
return new
