-- An operator frees a lock whoever holds it, and the next waiter gets it at once.
-- KEYS: lock fence queue waiters stats
-- ARGV: sigprefix fence_ttl_ms metrics_ttl_ms
-- -> {} nothing was held | {owner, fence, since_us, token}
local lock, fencek, queue, waiters, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local sigprefix, fence_ttl, metrics_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HMGET', lock, 'owner', 'fence', 'since_us', 'token')
if not held[4] then return {} end
count_hold(held[3], stats, metrics_ttl)
stat(stats, metrics_ttl, 'force_released')
redis.call('DEL', lock)
local head = purge(queue, waiters)
if head then
  hand_off(lock, fencek, fence_ttl, queue, waiters, stats, metrics_ttl, sigprefix, head)
end
touch_stats(stats, metrics_ttl)
return held
