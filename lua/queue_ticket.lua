-- flashgate queue ticket: the user's ticket number for an activity's waiting room, issued once
-- (asking again returns the same number). (lib.lua and queue_lib.lua are prepended.) O(1).
--
-- KEYS[1] the queue hash   KEYS[2] its tickets (user -> number)   KEYS[3] the stepped
-- admission's seen (place -> last poll): a ticket issued to a stepped queue after the draw
-- counts as seen now
-- ARGV[1] user   ARGV[2] configured rate   ARGV[3] the sale's start (unix ms)
-- ARGV[4] a random number: the queue's epoch if it is set up now
-- ARGV[8] a random seed (64 hex digits) and ARGV[9] its commitment: the draw's, if none was
--         chosen yet (see queue_commit)
-- ARGV[5] expire-at (unix s)
-- ARGV[6] the queue opens, ARGV[7] the sale closes (unix ms): no ticket is issued outside
--         [opens, closes) by Redis's clock, whatever the clock of the gateway that asks
-- KEYS[4] (optional) a proof-of-work solution's key: spent here, once (SET NX until ARGV[10],
--         unix ms); ARGV[11] '1' refuses a spent one (else, shadow mode, it is only reported);
--         ARGV[12] the queue epoch it is bound to. Expired by Redis's clock or of another epoch
--         counts as spent: the gateway checked both against its last read of Redis, and a
--         SET NX PXAT in the past writes nothing (the same solution would pass again and again)
--
-- Returns the queue state (see queue_reply) followed by the ticket number, 1 if it was
-- issued now, 0 if the user had it already, and 1 if the solution given was spent before (else
-- 0); or by 0 and 'early' (the queue is not open yet), 0 and 'late' (the sale closed) or 0 and
-- 'used' (a spent solution, enforced), when nothing was issued. Numbers grow with arrival (FIFO after the start)
-- but may skip: see below.

local q, tickets = KEYS[1], KEYS[2]
local now = now_ms()
queue_init(q, tickets, ARGV[2], ARGV[3], now, ARGV[4])
local s = queue_state(q)
queue_commit(q, s, ARGV[8], ARGV[9])
queue_reschedule(q, s, ARGV[3], now)
queue_freeze(q, s, now)
if now < tonumber(ARGV[6]) then
  return queue_reply(s, now, {'0', 'early'})
end
if now >= tonumber(ARGV[7]) then
  return queue_reply(s, now, {'0', 'late'})
end
local spent = '0'
if KEYS[4] then
  local stale = now >= tonumber(ARGV[10]) or ARGV[12] ~= s.epoch
  if stale or not redis.call('SET', KEYS[4], '1', 'NX', 'PXAT', ARGV[10]) then
    if ARGV[11] == '1' then
      return queue_reply(s, now, {'0', 'used'})
    end
    spent = '1'
  end
end
local n = redis.call('HGET', tickets, ARGV[1])
local fresh = '0'
if not n then
  -- The cursor passed everyone issued (the queue ran empty): the next number is the next
  -- place the cursor reaches, so a newcomer waits its turn at the rate like anyone, and the
  -- cursor never moves back (a ticket that lapsed stays lapsed). Numbers skipped are places
  -- nobody holds.
  local cursor = queue_cursor(s, now)
  if cursor > s.seq then
    s.seq = cursor
    redis.call('HSET', q, 'seq', int(s.seq))
  end
  s.seq = redis.call('HINCRBY', q, 'seq', 1)
  n = tostring(s.seq)
  redis.call('HSET', tickets, ARGV[1], n)
  fresh = '1'
  -- Only once drawn: a pre-queue ticket's number is not its place (queue_step counts the
  -- drawn places as seen at the start).
  if s.stepped and s.drawn then
    redis.call('HSET', KEYS[3], n, int(now))
    extend(KEYS[3], ARGV[5])
  end
end
extend(q, ARGV[5])
extend(tickets, ARGV[5])
return queue_reply(s, now, {n, fresh, spent})
