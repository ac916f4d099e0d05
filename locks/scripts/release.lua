-- KEYS: lock fence queue waiters wake taken
-- ARGV: token sigprefix fence_ttl_ms(0: one-shot) handoff_ms
-- -> 1 released (and handed to the next waiter, if any) | 0 not owned (expired or taken)
local lock, fencek, queue, waiters, wake, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token, sigprefix, fence_ttl, handoff = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

if redis.call('HGET', lock, 'token') ~= token then return 0 end
redis.call('DEL', lock)
wake_orphans(taken, sigprefix, nil)  -- taken by this hold and never answered
local head = purge(queue, waiters)
if head then
  hand_off(lock, fencek, fence_ttl, queue, waiters, wake, sigprefix, head, handoff)
elseif fence_ttl <= 0 then
  forget_one_shot(fencek, wake)
end
return 1
