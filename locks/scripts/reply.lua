-- The holder answers the requests it took (combining): each reply is pushed on its waiter's
-- signal list, kept until the waiter's deadline plus a grace (a waiter that gave up never reads
-- it), and struck from `taken` (no longer an orphan-to-be). One call for the whole batch: the
-- client packs one command instead of two per reply.
-- A waiter whose combiner was thought gone (its lease ran out: a GC pause) queued again; if that
-- combiner replies after all, the waiter is served and its second place goes too. Left queued,
-- a release would hand the lock to a waiter who is gone, and everyone behind it would wait out
-- the hand-off lease. (A taken request is in `waiters` only if it queued again: no LREM else.)
-- The other order: Redis hands the reply at once to the waiter's blocked BLPOP, which the waiter
-- may not read before its own timer makes it look at the lock again; its list is empty then. So
-- a marker (`<signal>:d`, until its deadline) tells acquire.lua "answered: wait on, do not queue".
-- First, in the same call, it releases the other locks the holder took with the batch
-- (take.lua's `also`; after its COMMIT): each as release.lua does, its six keys in KEYS.
-- KEYS: taken queue waiters [lock fence queue waiters wake taken of each lock released]
-- ARGV: signal_prefix grace_ms releases [token sigprefix fence_ttl_ms handoff_ms of each]
--       token1 reply1 deadline_ms1 token2 reply2 deadline_ms2 ...
--       (deadline_ms 0: unknown, kept for the grace only)
-- -> {the number of replies, {1 released | 0 not owned, of each lock released}}
local taken, queue, waiters = KEYS[1], KEYS[2], KEYS[3]
local prefix, grace, releases = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local released = {}
for r = 0, releases - 1 do
  local k, a = 4 + 6 * r, 4 + 4 * r
  released[#released + 1] = let_go(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5],
                                   ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]))
end
local n = 0
for i = 4 + 4 * releases, #ARGV, 3 do
  local token, left = ARGV[i], math.max(tonumber(ARGV[i + 2]) - NOW_MS, 0)
  local signal = prefix .. token
  redis.call('RPUSH', signal, 'd|' .. ARGV[i + 1])
  redis.call('PEXPIRE', signal, left + grace)
  redis.call('SET', signal .. ':d', '1', 'PX', left + 1000)
  redis.call('HDEL', taken, token)
  if redis.call('HDEL', waiters, token, 'p|' .. token, 'n|' .. token) > 0 then
    redis.call('LREM', queue, 0, token)
    if redis.call('LLEN', queue) == 0 then redis.call('DEL', waiters) end
  end
  n = n + 1
end
return {n, released}
