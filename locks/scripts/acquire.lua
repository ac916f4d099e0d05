-- KEYS: lock fence queue waiters stats
-- ARGV: token ttl_ms owner wait_ms sigprefix fence_ttl_ms metrics_ttl_ms
-- -> {1, fence, now_ms, since_ms} acquired (since_ms: when its lease began)
--  | {0, pttl_ms, now_ms} held by someone else (and, if wait_ms > 0, this token is queued:
--    a release will hand the lock over and push to its signal list)
local lock, fencek, queue, waiters, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, ttl, owner, wait = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local sigprefix, fence_ttl, metrics_ttl = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])

local held = redis.call('HMGET', lock, 'token', 'fence', 'since_us')
if held[1] == token then
  -- Handed over to us while we were between a timed-out BLPOP and this retry.
  redis.call('DEL', sigprefix .. token)
  return {1, tonumber(held[2]), NOW_MS, math.floor(tonumber(held[3]) / 1000)}
end
local head = purge(queue, waiters)
if not held[1] then
  if not head or head == token then
    local waited = 0
    if head then
      -- A queued waiter whose holder expired (no release to hand over): it is first in line.
      local info = redis.call('HGET', waiters, head)
      waited = NOW_US - tonumber(string.match(info, '^%d+|%d+|(%d+)|'))
      redis.call('LPOP', queue)
      redis.call('HDEL', waiters, head)
      stat(stats, metrics_ttl, 'contended')
    end
    local f = grant(lock, fencek, fence_ttl, token, ttl, owner, waited)
    count_acquired(stats, metrics_ttl)
    if head then stat(stats, metrics_ttl, 'w' .. bucket(waited)) end
    return {1, f, NOW_MS, NOW_MS}
  end
  -- Free, but others queued first (their holder expired or was forced out): serve them first.
  hand_off(lock, fencek, fence_ttl, queue, waiters, stats, metrics_ttl, sigprefix, head)
  touch_stats(stats, metrics_ttl)
end

if wait > 0 then
  local known = redis.call('HGET', waiters, token)
  local enq = NOW_US
  if known then
    enq = tonumber(string.match(known, '^%d+|%d+|(%d+)|'))
  else
    redis.call('RPUSH', queue, token)
  end
  redis.call('HSET', waiters, token, num(NOW_MS + wait) .. '|' .. ttl .. '|' .. num(enq) .. '|' .. owner)
  local keep = wait + ttl + 10000
  if redis.call('PTTL', queue) < keep then redis.call('PEXPIRE', queue, keep) end
  if redis.call('PTTL', waiters) < keep then redis.call('PEXPIRE', waiters, keep) end
end
return {0, redis.call('PTTL', lock), NOW_MS, 0}
