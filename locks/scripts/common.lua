-- Shared helpers, prepended to every lock script (see locks/scripts.py).
-- Keys of one lock share the hash tag {name}, so they live in one Redis Cluster slot:
--   lock   = <p>lock:{name}          hash: token fence owner since_us ttl wait_us count
--   fence  = <p>lock:{name}:fence    last fencing token issued (outlives the lock)
--   queue  = <p>lock:{name}:queue    FIFO list of waiting tokens
--   wait   = <p>lock:{name}:waiters  hash: token -> "deadline_ms|ttl_ms|enqueued_us|owner"
--   stats  = <p>lockstats:{name}     hash: counters and log2 histogram buckets (w<b> for waits
--            of contended acquisitions: an uncontended one waited 0; h<b> for finished holds)
--   signal = <p>lock:{name}:signal:<token>  per-waiter list the waiter BLPOPs
local T = redis.call('TIME')
local NOW_US = tonumber(T[1]) * 1000000 + tonumber(T[2])
local NOW_MS = math.floor(NOW_US / 1000)

local function num(x) return string.format('%d', x) end

-- 4 buckets per power of two of microseconds: bucket b covers [2^(b/4), 2^((b+1)/4)) us.
local function bucket(us)
  if us < 1 then return 0 end
  return math.floor(4 * math.log(us) / math.log(2))
end

local function stat(stats, metrics_ttl, field, by)
  if metrics_ttl > 0 then
    redis.call('HINCRBY', stats, field, by or 1)
  end
end

-- Count an acquisition; give the stats hash its TTL when this is its first one.
local function count_acquired(stats, metrics_ttl)
  if metrics_ttl > 0 and redis.call('HINCRBY', stats, 'acquired', 1) == 1 then
    redis.call('PEXPIRE', stats, metrics_ttl)
  end
end

local function touch_stats(stats, metrics_ttl)
  if metrics_ttl > 0 then redis.call('PEXPIRE', stats, metrics_ttl) end
end

-- A fence is never smaller than the Redis clock in microseconds, and always greater than the
-- last one issued: after a FLUSHALL or a restart without persistence the clock still moves on.
local function next_fence(fencek, fence_ttl)
  local last = tonumber(redis.call('GET', fencek) or '0')
  local f = NOW_US
  if f <= last then f = last + 1 end
  redis.call('SET', fencek, num(f), 'PX', fence_ttl)
  return f
end

local function grant(lock, fencek, fence_ttl, token, ttl, owner, wait_us)
  local f = next_fence(fencek, fence_ttl)
  redis.call('HSET', lock, 'token', token, 'fence', num(f), 'owner', owner,
             'since_us', num(NOW_US), 'ttl', ttl, 'wait_us', num(wait_us))
  redis.call('PEXPIRE', lock, ttl)
  return f
end

-- Drop waiters at the head of the queue whose own wait deadline has passed (crashed or gone).
local function purge(queue, waiters)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then return nil end
    local info = redis.call('HGET', waiters, head)
    local deadline = info and tonumber(string.match(info, '^(%d+)')) or 0
    if deadline > NOW_MS then return head end
    redis.call('LPOP', queue)
    redis.call('HDEL', waiters, head)
  end
end

-- Pass a free lock straight to the head waiter and wake only that waiter.
local function hand_off(lock, fencek, fence_ttl, queue, waiters, stats, metrics_ttl, sigprefix, head)
  local info = redis.call('HGET', waiters, head)
  local deadline, ttl, enq, owner = string.match(info, '^(%d+)|(%d+)|(%d+)|(.*)$')
  redis.call('LPOP', queue)
  redis.call('HDEL', waiters, head)
  local waited = NOW_US - tonumber(enq)
  local f = grant(lock, fencek, fence_ttl, head, tonumber(ttl), owner, waited)
  local sig = sigprefix .. head
  redis.call('RPUSH', sig, num(f) .. '|' .. num(NOW_MS))
  redis.call('PEXPIRE', sig, math.max(tonumber(deadline) - NOW_MS, 0) + 10000)
  stat(stats, metrics_ttl, 'acquired')
  stat(stats, metrics_ttl, 'contended')
  stat(stats, metrics_ttl, 'w' .. bucket(waited))
  return f
end

-- Count a finished hold (release or force release) in the hold-time histogram.
local function count_hold(since_us, stats, metrics_ttl)
  stat(stats, metrics_ttl, 'h' .. bucket(NOW_US - tonumber(since_us or NOW_US)))
end
