-- The holder takes the requests queued behind it (combining): FIFO from the head of the queue,
-- up to `limit`, stopping at the first plain waiter (one that needs the lock itself: it gets
-- it next, by hand-off, so FIFO order holds across batches). Waiters past their deadline are
-- dropped on the way. Each taken request is recorded in `taken` as ours: a taken waiter that
-- looks again while this hold lives keeps waiting for its reply; once the hold is gone without
-- a reply (released, expired, forced out) it is woken (wake_orphans) and queues again.
-- KEYS: lock queue waiters taken
-- ARGV: token limit
-- -> {now_ms, token1, deadline_ms1, payload1, token2, ...} | {-1} not the holder
local lock, queue, waiters, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, limit = ARGV[1], tonumber(ARGV[2])
if redis.call('HGET', lock, 'token') ~= token then return {-1} end
local out = {NOW_MS}
local n = 0
while n < limit do
  local head = purge(queue, waiters)
  if not head then break end
  local payload = redis.call('HGET', waiters, 'p|' .. head)
  if not payload then break end
  local deadline = parse_waiter(redis.call('HGET', waiters, head))
  redis.call('LPOP', queue)
  redis.call('HDEL', waiters, head, 'p|' .. head)
  redis.call('HSET', taken, head, token)
  if redis.call('PTTL', taken) < deadline - NOW_MS + 10000 then
    redis.call('PEXPIRE', taken, math.max(deadline - NOW_MS, 0) + 10000)
  end
  out[#out + 1] = head
  out[#out + 1] = deadline
  out[#out + 1] = payload
  n = n + 1
end
if n > 0 and redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters) end
return out
