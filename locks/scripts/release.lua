-- KEYS: lock fence queue waiters stats
-- ARGV: token sigprefix fence_ttl_ms metrics_ttl_ms
-- -> 1 released (and handed to the next live waiter, if any) | 0 not owned (expired or taken)
local lock, fencek, queue, waiters, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, sigprefix, fence_ttl, metrics_ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

local held = redis.call('HMGET', lock, 'token', 'since_us')
if held[1] ~= token then
  stat(stats, metrics_ttl, 'lost')
  touch_stats(stats, metrics_ttl)
  return 0
end
count_hold(held[2], stats, metrics_ttl)
redis.call('DEL', lock)
local head = purge(queue, waiters)
if head then
  hand_off(lock, fencek, fence_ttl, queue, waiters, stats, metrics_ttl, sigprefix, head)
end
touch_stats(stats, metrics_ttl)
return 1
