-- A waiter gives up. If a release handed it the lock in the meantime, it keeps it.
-- KEYS: lock queue waiters wake taken
-- ARGV: token sigprefix
-- -> {1, fence, now_ms, since_ms} the lock was handed over just in time
--  | {2, reply} a holder served this request (combining) just in time | {0} removed from the queue
local lock, queue, waiters, wake, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, sigprefix = ARGV[1], ARGV[2]
local pending = redis.call('LRANGE', sigprefix .. token, 0, -1)
redis.call('DEL', sigprefix .. token)
redis.call('HDEL', taken, token)
for _, message in ipairs(pending) do
  if string.sub(message, 1, 2) == 'd|' then
    redis.call('LREM', queue, 0, token)
    redis.call('HDEL', waiters, token, 'p|' .. token, 'n|' .. token)
    return {2, string.sub(message, 3)}
  end
end
local held = redis.call('HMGET', lock, 'token', 'fence', 'since_us')
if held[1] == token then
  return {1, tonumber(held[2]), NOW_MS, math.floor(tonumber(held[3]) / 1000)}
end
redis.call('LREM', queue, 0, token)
redis.call('HDEL', waiters, token, 'p|' .. token, 'n|' .. token)
if redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters, wake) end
return {0}
