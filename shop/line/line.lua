-- The line of one drop (shop/line/__init__.py, docs/design.md "The line"). One call per order
-- request; every step is atomic. Places are arrival times in Redis µs (TIME, kept strictly
-- increasing), so a line rebuilt after Redis lost it can take back a signed ticket's place and
-- nobody who comes later gets ahead of it.
-- KEYS: 1 meta (hash), 2 places (zset user -> place), 3 waiting (zset user -> place),
--       4 turns (zset user -> deadline ms: let through, not answered yet), 5 states (hash user ->
--       a let through | s in the checkout | d answered | l lapsed; r:<user> -> 1 if its place came
--       back from a ticket), 6 pre-queue (zset user -> order),
--       7 the product's sold-out marker, 8 doors (hash door -> "watermark µs, at ms, lag ms": see `advance`)
-- ARGV: 1 op (join | finish | units | release | status | door), 2 ttl s, 3 window, 4 turn ms, 5 paused (0/1),
--       6 settle from ms ('' or 0: never; see `advance`), 7 the caller's door: "lag ms/its name" ('' if none),
--       then the op's (numbered below from 6 as they always were: an op's argument n is ARGV[n + 2]).
local M, Q, W, T, S, P, MARK, D = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local op, ttl, window, turn_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local paused = ARGV[5] == '1'
local settle_from_ms = tonumber(ARGV[6] or '') or 0
local lag_text, door = string.match(ARGV[7] or '', '^(%d+)/?(.*)$')
local lag_ms = tonumber(lag_text or '')

local clock = redis.call('TIME')
local now_s = tonumber(clock[1])
local now_us = now_s * 1000000 + tonumber(clock[2])
local now_ms = math.floor(now_us / 1000)

-- Scores are integers above 10^15: never let Lua print them with its 14 digits.
local function num(x) return string.format('%.0f', x) end
local function field(name) return tonumber(redis.call('HGET', M, name) or '') end

local function touch()
  for _, key in ipairs({M, Q, W, T, S, P, D}) do redis.call('EXPIRE', key, ttl) end
end

-- Finished turns per second, in a ring of 8 one-second slots: the drain rate of the last 5 s.
local RING, SPAN = 8, 5
local function count_finished(n)
  local slot = now_s % RING
  if field('t' .. slot) ~= now_s then
    redis.call('HSET', M, 't' .. slot, now_s, 'r' .. slot, n)
  else
    redis.call('HINCRBY', M, 'r' .. slot, n)
  end
  redis.call('HINCRBY', M, 'finished', n)
end

-- Turns finished since the opening (at most the last SPAN s and this one so far), and over how
-- many ms: not whole seconds (a line opened late in a second that finished 20 turns in 0.2 s
-- drains 100 a second). The caller weighs them with a prior (shop/line `drain_rate`).
local function finished_lately()
  local total = 0
  for i = 0, SPAN do
    local second = now_s - i
    if field('t' .. (second % RING)) == second then total = total + (field('r' .. (second % RING)) or 0) end
  end
  local opened_ms = field('opened_ms') or (field('opened_s') or now_s) * 1000
  return total, math.max(1, now_ms - math.max(opened_ms, (now_s - SPAN) * 1000))
end

local function rate_milli(total, span_ms)  -- the operators' view: turns a second, as finished
  return math.floor(total * 1000000 / math.max(100, span_ms))
end

-- The doors' watermarks. Each door (a process's, shop/line/door.py) says with every call how far
-- behind it is: the age of the oldest arrival it holds and has not brought here yet (its lag), so
-- every arrival it may still bring came after its watermark (now - lag). It keeps that watermark
-- until it says more (a later call, or "caught up": lag 0), for at most DOOR_LIVE ms (a door that
-- died). While any door lags by `settle_from_ms` or more (a crowd), only places older than the
-- lowest watermark of the lagging doors are let through: the watermark does not move on with the
-- clock while its door is busy or stopped, so a door behind its backlog cannot be overtaken.
local DOOR_LIVE = 2000
local function note_door()
  if lag_ms then
    redis.call('HSET', D, door or '', num(now_us - lag_ms * 1000) .. ' ' .. now_ms .. ' ' .. lag_ms)
  end
end

local function settled_before_us()
  if settle_from_ms <= 0 then return nil end
  local low, gone = nil, {}
  local doors = redis.call('HGETALL', D)
  for i = 1, #doors, 2 do
    local wm, at, lag = string.match(doors[i + 1], '^(%d+) (%d+) (%d+)$')
    wm, at, lag = tonumber(wm), tonumber(at), tonumber(lag)
    if not at or now_ms - at > DOOR_LIVE then
      gone[#gone + 1] = doors[i]
    elseif lag >= settle_from_ms and (low == nil or wm < low) then
      low = wm
    end
  end
  if #gone > 0 then redis.call('HDEL', D, unpack(gone)) end
  return low
end

-- Turns past their deadline lapse (never came, or died in the checkout): the line moves on.
local function sweep()
  local gone = redis.call('ZRANGEBYSCORE', T, '-inf', now_ms, 'LIMIT', 0, 64)
  for _, user in ipairs(gone) do
    redis.call('ZREM', T, user)
    redis.call('HSET', S, user, 'l')
  end
  if #gone > 0 then
    count_finished(#gone)
    redis.call('HINCRBY', M, 'lapsed', #gone)
  end
end

-- Let the head of the line through while fewer than `window` turns are open, up to the cut-off,
-- and no more buyers at once than the stock has units. Not while paused, held or sold out.
-- While a door lags (a crowd), only places older than the lagging doors' watermarks are let
-- through (`settled_before_us`): an earlier arrival still at a door behind its backlog then comes
-- before them, instead of finding its turn taken by buyers who came later to a quicker door.
local held_by_door = nil  -- the watermark `advance` held places back by, this call

local function advance()
  if paused or (field('hold') or 0) > now_ms or redis.call('EXISTS', MARK) == 1 then return end
  local cut, units, stock = field('cut'), field('units'), field('stock')
  local busy = redis.call('ZCARD', T)
  if cut and busy == 0 and (units == nil or units > 0)
      and redis.call('ZCOUNT', W, '-inf', '(' .. num(cut)) == 0 then
    redis.call('HDEL', M, 'cut')  -- everyone before it was answered and units are left: lift it
    cut = nil
  end
  if busy >= window then return end
  local settled_us = settled_before_us()
  held_by_door = settled_us
  local head = redis.call('ZRANGE', W, 0, window - busy - 1, 'WITHSCORES')
  local front = field('front') or 0
  local moved = false
  for i = 1, #head, 2 do
    local user, place = head[i], tonumber(head[i + 1])
    if (cut and place >= cut) or (stock and busy >= stock) then break end
    if settled_us and place > settled_us then break end
    redis.call('ZREM', W, user)
    redis.call('ZADD', T, now_ms + turn_ms, user)
    redis.call('HSET', S, user, 'a')
    busy = busy + 1
    if place > front then front, moved = place, true end
  end
  if moved then redis.call('HSET', M, 'front', num(front)) end
end

-- The first call at or after opens_at: the pre-queue takes the first places, in its order.
local function open_line(opens_us)
  local members = redis.call('ZRANGE', P, 0, -1)
  local base = math.min(opens_us, now_us) - #members - 1
  for i, user in ipairs(members) do
    redis.call('ZADD', Q, 'NX', num(base + i), user)
    redis.call('ZADD', W, 'NX', num(base + i), user)
  end
  redis.call('DEL', P)
  redis.call('HSET', M, 'opened', '1', 'opened_s', now_s, 'opened_ms', now_ms, 'prequeued', #members,
             'last', num(math.max(field('last') or 0, base + #members)))
end

local function serving()
  local front = field('front') or 0
  return front, redis.call('ZCOUNT', Q, '-inf', num(front))
end

if op == 'join' then
  -- 6 user, 7 start (1: take the turn now), 8 checkout ms, 9 the shop's time ms (the database's
  -- clock, shop/plumbing/clock.py: it decides the window, as at the writer), 10 opens_at ms,
  -- 11 pre-queue ms, 12 fifo (1/0), 13 a random order, 14 claimed kind (p|q|''), 15 claimed score,
  -- 16 units refresh ms, 17 hold ms, 18 an arrival stamp's time ms ('' without one: checked by
  -- the caller, shop/line/arrivals.py), 19 the shop's time ms, its best estimate (9 is the
  -- latest it may be, for "not open yet"; this one dates an arrival), 20 the same arrival as 18
  -- on Redis's clock in µs ('' if not known: then dated from 18 and 19)
  local user, start, checkout_ms = ARGV[8], ARGV[9] == '1', tonumber(ARGV[10])
  local app_ms, opens_ms, prequeue_ms = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
  local kind, claim = ARGV[16], tonumber(ARGV[17])
  local arrived_ms = tonumber(ARGV[20] or '')
  local shop_ms = tonumber(ARGV[21] or '') or app_ms
  -- A stamp's arrival in Redis time: as long ago as the shop's clock says it was, or (20) the
  -- caller's reading of it on Redis's clock (never after now).
  local arrived_us = arrived_ms and (now_us - math.max(0, shop_ms - arrived_ms) * 1000) or now_us
  local given_us = tonumber(ARGV[22] or '')
  if arrived_ms and given_us then arrived_us = math.min(now_us, given_us) end
  -- A line made after its opening may be one Redis lost: let nobody through for `hold` ms
  -- (17) while the caller asks MySQL whether this drop had a line before (then buyers come
  -- back with their tickets meanwhile) or not (then it releases the hold at once).
  if redis.call('HGET', M, 'opened') ~= '1' and app_ms < opens_ms - prequeue_ms then return {'not_open'} end
  note_door()
  local born = 0
  if redis.call('HSETNX', M, 'born', num(now_us)) == 1 then
    born = 1
    if app_ms >= opens_ms + 2000 then redis.call('HSET', M, 'hold', now_ms + tonumber(ARGV[19])) end
  end
  if redis.call('HGET', M, 'opened') ~= '1' then
    if app_ms < opens_ms then
      local order = redis.call('ZSCORE', P, user)
      if not order then
        if kind == 'q' and claim then order = claim
        elseif ARGV[14] == '1' then order = arrived_us
        else order = tonumber(ARGV[15]) end
        redis.call('ZADD', P, 'NX', num(order), user)
      end
      touch()
      return {'pre_queue', num(tonumber(order)), redis.call('ZCARD', P), born}
    end
    open_line(opens_ms * 1000)
  end
  sweep()
  local place = tonumber(redis.call('ZSCORE', Q, user) or '')
  if kind ~= 'p' then claim = nil end
  if place == nil then
    if claim then
      place = claim  -- a place this account held before Redis lost the line (a signed ticket)
      redis.call('HSET', S, 'r:' .. user, '1')
    elseif arrived_ms then
      -- told busy before (a signed stamp): the place of its first arrival. One that came in the
      -- pre-queue's window takes a place right after the pre-queue, shuffled (or in its order).
      if arrived_ms < opens_ms then
        local offset = tonumber(ARGV[15]) % 1000
        if ARGV[14] == '1' then offset = math.floor((arrived_ms - opens_ms + prequeue_ms) * 999 / math.max(1, prequeue_ms)) end
        place = opens_ms * 1000 + offset
      else
        place = arrived_us
      end
      while redis.call('ZCOUNT', Q, num(place), num(place)) > 0 do place = place + 1 end
      if place > (field('last') or 0) then redis.call('HSET', M, 'last', num(place)) end
      if place < (field('front') or 0) then redis.call('HSET', S, 'r:' .. user, '1') end
    else
      place = math.max(now_us, (field('last') or 0) + 1)
      redis.call('HSET', M, 'last', num(place))
    end
    redis.call('ZADD', Q, num(place), user)
    redis.call('ZADD', W, num(place), user)
  elseif claim and claim < place then
    place = claim  -- came back without its ticket first: the ticket's earlier place stands
    redis.call('HSET', S, 'r:' .. user, '1')
    redis.call('ZADD', Q, 'XX', num(place), user)
    redis.call('ZADD', W, 'XX', num(place), user)
  end
  advance()
  local state, answer, ahead, soon = redis.call('HGET', S, user), 'waiting', 0, 0
  local busy = redis.call('ZCARD', T)
  if redis.call('EXISTS', MARK) == 1 then
    answer = 'sold_out'
  elseif state == 'a' or state == 'd' or state == 'l' then
    -- let through, or let through before and back (answered, lapsed): its turn, once at a time
    answer = 'admitted'
    if start then
      redis.call('HSET', S, user, 's')
      redis.call('ZADD', T, now_ms + checkout_ms, user)
      answer = 'started'
    end
  elseif state == 's' then
    answer = 'in_checkout'
  else
    ahead = busy + redis.call('ZRANK', W, user)
    local cut, units, stock = field('cut'), field('units'), field('stock')
    -- its turn would have come but for a door's watermark: the door may ask again in a moment
    soon = (held_by_door and place > held_by_door and ahead < window and (stock == nil or ahead < stock)) and 1 or 0
    if cut and place >= cut then
      answer = 'cut'
    elseif units and ahead >= units then
      -- A place dated before the front (an arrival the door or a stamp registered late) that the
      -- units cannot reach is told so alone: a cut there would fall behind buyers let through.
      if place > (field('front') or 0) then
        redis.call('HSET', M, 'cut', num(cut and math.min(cut, place) or place))
      end
      answer = 'cut'
    end
  end
  local need_units = 0
  if now_ms - (field('units_at') or 0) >= tonumber(ARGV[18]) then
    redis.call('HSET', M, 'units_at', now_ms)  -- this caller refreshes them; the others need not
    need_units = 1
  end
  touch()
  local front, serving_rank = serving()
  local finished, span_ms = finished_lately()
  -- answer, place, its rank, ahead, serving's rank, front, turns finished lately (over span_ms:
  -- `drain_rate`), units due, waiting, born, span_ms, soon
  return {answer, num(place), redis.call('ZRANK', Q, user) + 1, ahead, serving_rank, num(front),
          finished, need_units, redis.call('ZCARD', W), born, span_ms, soon}
elseif op == 'finish' then
  -- 6 user, 7 outcome: 'done' (answered: placed or refused) or 'retry' (keeps its turn)
  local user = ARGV[8]
  if redis.call('HGET', S, user) ~= 's' then return 0 end  -- lapsed meanwhile, or counted already
  if ARGV[9] == 'retry' then
    redis.call('HSET', S, user, 'a')
    redis.call('ZADD', T, now_ms + turn_ms, user)
  else
    redis.call('HSET', S, user, 'd')
    redis.call('ZREM', T, user)
    count_finished(1)
    advance()
  end
  touch()
  return 1
elseif op == 'units' then
  -- 6 units the line can still sell (stock + unpaid reservations), 7 the stock (MySQL, just read)
  redis.call('HSET', M, 'units', ARGV[8], 'stock', ARGV[9], 'units_at', now_ms)
  touch()
  return 1
elseif op == 'stock' then
  -- 6 the stock the checkout's writer left (after its COMMIT)
  redis.call('HSET', M, 'stock', ARGV[8])
  advance()
  touch()
  return 1
elseif op == 'door' then
  -- a door says how far behind it is without a buyer (caught up: lag 0): the line may move on
  note_door()
  if redis.call('HGET', M, 'opened') == '1' then
    sweep()
    advance()
  end
  touch()
  return 1
elseif op == 'release' then
  redis.call('HDEL', M, 'hold')  -- a new line, not one Redis lost
  return 1
elseif op == 'status' then
  local front, serving_rank = serving()
  local back = redis.call('ZRANGE', W, -1, -1, 'WITHSCORES')
  return {redis.call('ZCARD', Q), redis.call('ZCARD', W), redis.call('ZCARD', T), redis.call('ZCARD', P),
          num(front), serving_rank, num(field('cut') or -1), field('finished') or 0, field('lapsed') or 0,
          rate_milli(finished_lately()), num(field('units') or -1), redis.call('HGET', M, 'opened') or '0',
          redis.call('EXISTS', MARK), redis.call('HGET', M, 'prequeued') or '0'}
end
return redis.error_reply('unknown op ' .. tostring(op))
