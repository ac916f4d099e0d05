-- The holder takes the requests queued behind it (combining): FIFO from the head of the queue,
-- up to `limit`, stopping at the first plain waiter (one that needs the lock itself: it gets
-- it next, by hand-off, so FIFO order holds across batches). Waiters past their deadline are
-- dropped on the way. Each taken request is recorded in `taken` as ours: a taken waiter that
-- looks again while this hold lives keeps waiting for its reply; once the hold is gone without
-- a reply (released, expired, forced out) it is woken (wake_orphans) and queues again.
-- With the `also` arguments, the other locks the batch needs (the holder's own `mine` and each
-- taken request's needs, acquire.lua's ARGV[10]) are taken in the same call, each as a
-- non-blocking acquire would (`grab`: free and nobody queued, else not taken; sorted by name),
-- all with the token `also_token`. Their keys are not in KEYS: one server only (not a cluster).
-- KEYS: lock queue waiters taken
-- ARGV: token limit [also_token ttl_ms owner fence_ttl_ms handoff_ms key_prefix mine]
-- -> {now_ms, {token1, deadline_ms1, payload1, needs1, token2, ...}, {name1, fence1, ...}}
--  | {-1} not the holder
local lock, queue, waiters, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, limit = ARGV[1], tonumber(ARGV[2])
if redis.call('HGET', lock, 'token') ~= token then return {-1} end
local batch, needed = {}, {}
local function need(names)
  for name in string.gmatch(names or '', '[^,]+') do needed[name] = true end
end
need(ARGV[9])
local n = 0
while n < limit do
  local head = purge(queue, waiters)
  if not head then break end
  local got = redis.call('HMGET', waiters, 'p|' .. head, 'n|' .. head)
  local payload, needs = got[1], got[2]
  if not payload then break end
  local deadline = parse_waiter(redis.call('HGET', waiters, head))
  redis.call('LPOP', queue)
  redis.call('HDEL', waiters, head, 'p|' .. head, 'n|' .. head)
  redis.call('HSET', taken, head, token)
  if redis.call('PTTL', taken) < deadline - NOW_MS + 10000 then
    redis.call('PEXPIRE', taken, math.max(deadline - NOW_MS, 0) + 10000)
  end
  batch[#batch + 1] = head
  batch[#batch + 1] = deadline
  batch[#batch + 1] = payload
  batch[#batch + 1] = needs or ''
  need(needs)
  n = n + 1
end
if n > 0 and redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters) end
local grants = {}
if ARGV[3] then
  local names = {}
  for name in pairs(needed) do names[#names + 1] = name end
  table.sort(names)
  local ttl, fence_ttl, handoff = tonumber(ARGV[4]), tonumber(ARGV[6]), tonumber(ARGV[7])
  for _, name in ipairs(names) do
    local f = grab(ARGV[8], name, ARGV[3], ttl, ARGV[5], fence_ttl, handoff)
    if f then
      grants[#grants + 1] = name
      grants[#grants + 1] = f
    end
  end
end
return {NOW_MS, batch, grants}
