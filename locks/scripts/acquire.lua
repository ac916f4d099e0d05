-- KEYS: lock fence queue waiters wake taken [guard...]
-- ARGV: token ttl_ms owner wait_ms sigprefix fence_ttl_ms(0: one-shot) handoff_ms give_up_ms
--       payload ('' or absent: a plain acquire; else a request a holder may serve: combining)
--       needs (combining: the names of other locks, comma-separated, that the holder who serves
--       this request must also hold; take.lua takes them with the batch)
-- -> {1, fence, now_ms, since_ms} acquired (since_ms: when its lease began)
--  | {-1, 0, now_ms} arrived after give_up_ms: nothing done
--  | {3, 0, now_ms, 0, {values}} a guard key exists: nothing done; the guards' values (combining)
--  | {2, pttl_ms, now_ms} this request is in the holder's batch, or its reply is waiting: wait on
--  | {0, pttl_ms, now_ms} held by someone else (and, if wait_ms > 0, this token is queued:
--    a release will hand the lock over and push to its signal list)
local lock, fencek, queue, waiters, wake, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, ttl, owner, wait = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local sigprefix, fence_ttl, handoff = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
-- ARGV[8]: the Redis time (ms) after which the client has given up on this call (0: unknown).
-- A frozen Redis runs buffered commands when it wakes: an abandoned acquire must not queue.
local give_up = tonumber(ARGV[8] or '0')
if give_up > 0 and NOW_MS > give_up then return {-1, 0, NOW_MS} end
-- Guards (KEYS after the lock's six, a request's first send only): keys whose existence stops the
-- request before it queues, e.g. a sold-out marker. Read here, they cost no round trip of their own.
if #KEYS > 6 then
  local values = redis.call('MGET', unpack(KEYS, 7))
  for i = 1, #values do
    if values[i] then return {3, 0, NOW_MS, 0, values} end
  end
end

local held = redis.call('HMGET', lock, 'token', 'fence', 'since_us')
if held[1] == token then
  -- Handed over to us while we were between a wait and this retry.
  redis.call('DEL', sigprefix .. token)
  return {1, tonumber(held[2]), NOW_MS, math.floor(tonumber(held[3]) / 1000)}
end
local payload = ARGV[9] or ''
if payload ~= '' then
  local by = redis.call('HGET', taken, token)
  if (by and by == held[1]) or redis.call('LLEN', sigprefix .. token) > 0
      or redis.call('EXISTS', sigprefix .. token .. ':d') == 1 then
    -- A request taken into the current holder's batch (or already answered: its reply may be
    -- on its way to our blocked read, reply.lua's marker) looks again when that holder's lease
    -- ends: it keeps waiting while the holder lives. If the holder is gone without replying,
    -- the request queues again (a new holder serves it; the request id's unique key in MySQL
    -- makes sure it is committed at most once).
    return {2, math.max(redis.call('PTTL', lock), 0), NOW_MS, 0}
  end
  if by then redis.call('HDEL', taken, token) end
end
local head = purge(queue, waiters)
if not held[1] then
  wake_orphans(taken, sigprefix, nil)
  if not head or head == token then
    local waited = 0
    if head then
      -- A queued waiter whose holder expired (no release to hand over): it is first in line.
      local _, _, enq = parse_waiter(redis.call('HGET', waiters, head))
      waited = NOW_US - enq
      redis.call('LPOP', queue)
      redis.call('HDEL', waiters, head, 'p|' .. head, 'n|' .. head)
      if redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters) end
      redis.call('DEL', sigprefix .. token)
    end
    local f = grant(lock, fencek, fence_ttl, token, ttl, ttl, owner, waited)
    nudge(lock, waiters, wake)
    return {1, f, NOW_MS, NOW_MS}
  end
  -- Free, but others queued first (their holder expired or was forced out): serve them first.
  hand_off(lock, fencek, fence_ttl, queue, waiters, wake, sigprefix, head, handoff)
end

local pttl = redis.call('PTTL', lock)
if wait > 0 then
  local known = redis.call('HGET', waiters, token)
  local enq = NOW_US
  if known then
    local _, _, e = parse_waiter(known)
    enq = e
  else
    redis.call('RPUSH', queue, token)
  end
  redis.call('HSET', waiters, token, num(NOW_MS + wait) .. '|' .. ttl .. '|' .. num(enq) .. '|' .. owner)
  if payload ~= '' then
    redis.call('HSET', waiters, 'p|' .. token, payload)
    if (ARGV[10] or '') ~= '' then redis.call('HSET', waiters, 'n|' .. token, ARGV[10]) end
  end
  -- We look again by ourselves when this lease ends; nudge() needs the latest such time.
  local ends = NOW_MS + math.max(pttl, 0)
  if tonumber(redis.call('HGET', waiters, '~') or '0') < ends then redis.call('HSET', waiters, '~', num(ends)) end
  local keep = wait + ttl + 10000
  if redis.call('PTTL', queue) < keep then redis.call('PEXPIRE', queue, keep) end
  if redis.call('PTTL', waiters) < keep then redis.call('PEXPIRE', waiters, keep) end
end
return {0, pttl, NOW_MS, 0}
