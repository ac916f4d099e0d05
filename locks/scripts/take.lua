-- The holder takes the requests queued behind it (combining; take_for in common.lua): FIFO
-- from the head of the queue, up to `limit`. A combiner whose grant carried its batch has it
-- already; this is for one granted another way, or a second take.
-- KEYS: lock queue waiters taken
-- ARGV: token limit
-- -> {now_ms, token1, deadline_ms1, payload1, token2, ...} | {-1} not the holder
local lock, queue, waiters, taken = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, limit = ARGV[1], tonumber(ARGV[2])
if redis.call('HGET', lock, 'token') ~= token then return {-1} end
local batch = take_for(token, limit, queue, waiters, taken)
if #batch > 0 and redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters) end
return {NOW_MS, unpack(batch)}
