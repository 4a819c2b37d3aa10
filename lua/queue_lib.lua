-- flashgate waiting room, shared by the queue scripts (prepended after lib.lua).
--
-- The queue of one activity lives on its base tag: <p>:{<id>}:q, a hash, and <p>:{<id>}:q:tickets
-- (user id -> ticket number). Fields of the hash:
--   seq      the last ticket number issued (one per user; numbers skip the places a cursor
--            that ran past everyone passed)
--   start    the sale's start (unix ms): the cursor is 0 before it
--   rate     places admitted per second, for the whole fleet
--   base, t0 the cursor: base + (now - t0) * rate / 1000 places while running (times in ms, by
--            Redis's clock), base while paused or held
--   paused   1 while an operator paused it
--   held     1 while nothing is left to sell (the cursor waits for units to come back)
--   drawn    the tickets issued before the start (their places are drawn at the start), once
--            the start has passed; seed: the draw's seed (see src/waiting/draw.rs)
-- A ticket's place: its number, or for a ticket drawn at the start its drawn place (1..drawn).
-- Place p is admitted once the cursor reaches p.

local function queue_state(q)
  local f = redis.call('HMGET', q, 'seq', 'start', 'rate', 'base', 't0', 'paused', 'held',
    'drawn', 'seed', 'epoch')
  return {seq = tonumber(f[1] or '0'), start = tonumber(f[2] or '0'), rate = tonumber(f[3] or '1'),
    base = tonumber(f[4] or '0'), t0 = tonumber(f[5] or '0'), paused = f[6] == '1',
    held = f[7] == '1', drawn = f[8], seed = f[9], epoch = tonumber(f[10] or '0')}
end

-- Sets up a queue the first time (the rate from the configuration; later changes come from a
-- reload or the admin API, never from a restart with an older file).
-- A sale postponed (a reload, or a restart with a newer file) before its start: the queue waits
-- for the later start. Never earlier, and never once the start passed: a gateway with an older
-- file cannot move it back, and a running queue keeps its places.
local function queue_reschedule(q, s, start, now)
  local want = tonumber(start)
  if want > s.start and now < s.start then
    s.start = want
    s.t0 = want
    redis.call('HSET', q, 'start', int(want), 't0', int(want), 'base', 0)
    s.base = 0
  end
end

-- The cursor runs from the start, or from now for a queue set up after it. `epoch`: when this
-- queue was set up; a ticket issued before it belongs to a queue Redis lost, and is not honoured.
local function queue_init(q, tickets, rate, start, now)
  if redis.call('HSETNX', q, 'start', start) == 1 then
    -- Tickets of a lost queue say nothing about this one.
    redis.call('DEL', tickets)
    redis.call('HSET', q, 'rate', rate, 'base', 0, 't0', int(math.max(now, tonumber(start))),
      'seq', 0, 'epoch', int(now))
  end
end

local function queue_cursor(s, now)
  if now < s.start then
    return 0
  end
  if s.paused or s.held then
    return s.base
  end
  return s.base + math.floor((now - s.t0) * s.rate / 1000)
end

-- Restarts the cursor from where it is now (before a change of rate, pause or hold).
local function queue_rebase(q, s, now)
  s.base = queue_cursor(s, now)
  s.t0 = math.max(now, s.start)
  redis.call('HSET', q, 'base', int(s.base), 't0', int(s.t0))
end

-- At the first call at or after the start: the tickets issued so far are drawn, from `seed`.
local function queue_freeze(q, s, now, seed)
  if now >= s.start and not s.drawn then
    s.drawn = tostring(s.seq)
    s.seed = seed
    redis.call('HSET', q, 'drawn', s.drawn, 'seed', seed)
  end
end

local function queue_reply(s, now, extra)
  local out = {int(s.seq), int(s.start), int(s.rate), int(s.base), int(s.t0),
    s.paused and '1' or '0', s.held and '1' or '0', s.drawn or '', s.seed or '', int(now),
    int(s.epoch)}
  for _, v in ipairs(extra or {}) do
    out[#out + 1] = v
  end
  return out
end
