-- KEYS: lock fence queue waiters wake taken
-- ARGV: token sigprefix fence_ttl_ms(0: one-shot) handoff_ms
-- -> 1 released (and handed to the next waiter, if any) | 0 not owned (expired or taken)
return let_go(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[1], ARGV[2], tonumber(ARGV[3]),
              tonumber(ARGV[4]))
