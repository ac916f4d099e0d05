-- An operator frees a lock whoever holds it, and the next waiter gets it at once.
-- KEYS: lock fence queue waiters wake taken
-- ARGV: sigprefix fence_ttl_ms handoff_ms expected_fence ('0': whoever holds it)
-- -> {} nothing was held | {owner, fence, since_us, token} | {'changed', owner, fence}: another
--    holder than the one the operator saw (nothing touched)
local lock, fencek, queue, waiters, wake, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local sigprefix, fence_ttl, handoff, expected = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local held = redis.call('HMGET', lock, 'owner', 'fence', 'since_us', 'token', 'os')
if not held[4] then return {} end
if expected ~= '0' and held[2] ~= expected then return {'changed', held[1], held[2]} end
if held[5] == '1' then fence_ttl = 0 end  -- a one-shot lock stays one-shot
free(lock, fencek, queue, waiters, wake, taken, sigprefix, fence_ttl, handoff)
return {held[1], held[2], held[3], held[4]}
