-- Is this token still the holder? (A force release or an expiry ends a hold behind its back.)
-- KEYS: lock
-- ARGV: token
-- -> pttl_ms (> 0) still held | 0 not held by this token
local left = redis.call('PTTL', KEYS[1])
if left <= 0 or redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
return left
