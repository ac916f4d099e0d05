-- Shared helpers, prepended to every lock script (see locks/scripts.py).
-- Keys of one lock share the hash tag {name}, so they live in one Redis Cluster slot:
--   lock   = <p>lock:{name}          hash: token fence owner since_us ttl wait_us count
--   fence  = <p>lock:{name}:fence    last fencing token issued (outlives the lock)
--   queue  = <p>lock:{name}:queue    FIFO list of waiting tokens
--   wait   = <p>lock:{name}:waiters  hash: token -> "deadline_ms|ttl_ms|enqueued_us|owner",
--            "p|<token>" -> the waiter's request, if it asks to be served (combining: take.lua),
--            and "~" -> the latest lease end any waiter was told (it looks again by itself then)
--   wake   = <p>lock:{name}:wake     list every waiter BLPOPs besides its own signal list
--   signal = <p>lock:{name}:signal:<token>  per-waiter list the waiter BLPOPs
--            (and <signal>:d: a combiner replied to this request, until its deadline; reply.lua)
--   taken  = <p>lock:{name}:taken    hash: request token -> token of the holder that took it into
--            its batch (combining, take.lua); removed when the holder replies
-- No script writes statistics: they are counted by each client process and flushed once a
-- second to per-family keys (locks/stats.py), which would live in other slots.
-- fence_ttl_ms = 0 marks a one-shot lock: its fence key lives only as long as the lease and is
-- deleted at release, so nothing of the lock remains once it is free (the lock hash says 'os').
local T = redis.call('TIME')
local NOW_US = tonumber(T[1]) * 1000000 + tonumber(T[2])
local NOW_MS = math.floor(NOW_US / 1000)

local function num(x) return string.format('%d', x) end

-- A fence is never smaller than the Redis clock in microseconds, and always greater than the
-- last one issued: after a FLUSHALL or a restart without persistence the clock still moves on.
-- A one-shot lock keeps its fence key only for the lease: later fences rest on the clock alone.
local function next_fence(fencek, keep_ms)
  local last = tonumber(redis.call('GET', fencek) or '0')
  local f = NOW_US
  if f <= last then f = last + 1 end
  redis.call('SET', fencek, num(f), 'PX', keep_ms)
  return f
end

-- `lease` is what the lock lives for now; `ttl` the holder's own lease (a hand-off starts shorter).
local function grant(lock, fencek, fence_ttl, token, lease, ttl, owner, wait_us)
  local one_shot = fence_ttl <= 0
  local f = next_fence(fencek, one_shot and lease or fence_ttl)
  redis.call('HSET', lock, 'token', token, 'fence', num(f), 'owner', owner,
             'since_us', num(NOW_US), 'ttl', ttl, 'wait_us', num(wait_us))
  if one_shot then redis.call('HSET', lock, 'os', '1') end
  redis.call('PEXPIRE', lock, lease)
  return f
end

local function parse_waiter(info)
  local deadline, ttl, enq, owner = string.match(info, '^(%d+)|(%d+)|(%d+)|(.*)$')
  return tonumber(deadline), tonumber(ttl), tonumber(enq), owner
end

local function signal(sigprefix, token, deadline, payload)
  local sig = sigprefix .. token
  redis.call('RPUSH', sig, payload)
  redis.call('PEXPIRE', sig, math.max(deadline - NOW_MS, 0) + 10000)
end

-- A waiter looks again by itself when the lease it was told of ends: that is how it learns of
-- a holder that died. If the lock has since passed to a holder whose lease ends sooner (a short
-- hand-off lease after a long one), every waiter would oversleep, the head included, and the
-- head may itself be dead. So push one "look again" to the wake list: Redis serves a push only
-- to a client still blocked on it, i.e. to a live waiter, and one live waiter looking again
-- keeps the queue moving (at the new lease end it takes the lock or hands it to the head).
-- Under steady contention leases only move later and this costs nothing.
local function nudge(lock, waiters, wake)
  local latest = tonumber(redis.call('HGET', waiters, '~') or '0')
  local ends = NOW_MS + math.max(redis.call('PTTL', lock), 0)
  if latest > ends + 1 then
    redis.call('RPUSH', wake, 'r')
    redis.call('PEXPIRE', wake, math.max(redis.call('PTTL', waiters), 1000))
    redis.call('HSET', waiters, '~', num(ends))
  end
end

-- Drop waiters at the head of the queue whose own wait deadline has passed (crashed or gone).
local function purge(queue, waiters)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then return nil end
    local info = redis.call('HGET', waiters, head)
    local deadline = info and parse_waiter(info) or 0
    if deadline > NOW_MS then return head end
    redis.call('LPOP', queue)
    redis.call('HDEL', waiters, head, 'p|' .. head, 'n|' .. head)
    if redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters) end
  end
end

-- Pass a free lock straight to the head waiter and wake only that waiter. The waiter may have
-- died while queued (SIGKILL, OOM): it is handed a short lease (`handoff_ms`), which a live
-- waiter confirms to its full ttl if it holds that long; a dead one costs only that lease.
local function hand_off(lock, fencek, fence_ttl, queue, waiters, wake, sigprefix, head, handoff_ms)
  local deadline, ttl, enq, owner = parse_waiter(redis.call('HGET', waiters, head))
  redis.call('LPOP', queue)
  redis.call('HDEL', waiters, head, 'p|' .. head, 'n|' .. head)
  local waited = NOW_US - enq
  local lease = math.min(ttl, handoff_ms)
  local f = grant(lock, fencek, fence_ttl, head, lease, ttl, owner, waited)
  signal(sigprefix, head, deadline, 'g|' .. num(f) .. '|' .. num(NOW_MS) .. '|' .. num(lease))
  if redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters) else nudge(lock, waiters, wake) end
  return f
end

-- A lock is free and nobody waits: a one-shot lock leaves nothing behind.
local function forget_one_shot(fencek, wake)
  redis.call('DEL', fencek, wake)
end

-- Requests taken into a batch whose holder is gone without replying (it crashed, was paused
-- past its lease, or was forced out) are orphans: their waiters are not queued, so no hand-off
-- reaches them, and their own timers may be far off (they were told of an earlier, longer
-- lease). Tell each to look again now: it queues again and the next holder serves it. Called
-- wherever a hold is seen to have ended: a release, a force release, an acquire of a free lock.
-- `live` is the token of the hold that still counts (nil: none).
local function wake_orphans(taken, sigprefix, live)
  local entries = redis.call('HGETALL', taken)
  for i = 1, #entries, 2 do
    if entries[i + 1] ~= live then
      local sig = sigprefix .. entries[i]
      redis.call('RPUSH', sig, 'r')
      redis.call('PEXPIRE', sig, 10000)
      redis.call('HDEL', taken, entries[i])
    end
  end
end

-- The keys of the lock named `name` under key prefix `prefix` (locks/keys.py: LockKeys).
local function lock_keys(prefix, name)
  local lock = prefix .. 'lock:{' .. name .. '}'
  return lock, lock .. ':fence', lock .. ':queue', lock .. ':waiters', lock .. ':wake', lock .. ':taken',
         lock .. ':signal:'
end

-- A non-blocking acquire by a caller that is not queued (acquire.lua with wait 0, no payload):
-- the fence if the lock was free and nobody waited; nil if it is held, or if waiters queued
-- first (it is handed to the head: FIFO holds for them too).
local function grab(prefix, name, token, ttl, owner, fence_ttl, handoff)
  local lock, fencek, queue, waiters, wake, taken, sigprefix = lock_keys(prefix, name)
  if redis.call('EXISTS', lock) == 1 then return nil end
  wake_orphans(taken, sigprefix, nil)
  local head = purge(queue, waiters)
  if head then
    hand_off(lock, fencek, fence_ttl, queue, waiters, wake, sigprefix, head, handoff)
    return nil
  end
  local f = grant(lock, fencek, fence_ttl, token, ttl, ttl, owner, 0)
  nudge(lock, waiters, wake)
  return f
end

-- End the current hold: the lock goes to the next waiter, if any (a one-shot lock nobody waits
-- for leaves nothing behind); requests the hold took and never answered are woken.
local function free(lock, fencek, queue, waiters, wake, taken, sigprefix, fence_ttl, handoff)
  redis.call('DEL', lock)
  wake_orphans(taken, sigprefix, nil)
  local head = purge(queue, waiters)
  if head then
    hand_off(lock, fencek, fence_ttl, queue, waiters, wake, sigprefix, head, handoff)
  elseif fence_ttl <= 0 then
    forget_one_shot(fencek, wake)
  end
end

-- release.lua's work on one lock: 1 released (and handed to the next waiter, if any), 0 not
-- owned (its lease ended, or another holds it).
local function let_go(lock, fencek, queue, waiters, wake, taken, token, sigprefix, fence_ttl, handoff)
  if redis.call('HGET', lock, 'token') ~= token then return 0 end
  free(lock, fencek, queue, waiters, wake, taken, sigprefix, fence_ttl, handoff)
  return 1
end
