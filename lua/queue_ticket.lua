-- flashgate queue ticket: the user's ticket number for an activity's waiting room, issued once
-- (asking again returns the same number). (lib.lua and queue_lib.lua are prepended.) O(1).
--
-- KEYS[1] the queue hash   KEYS[2] its tickets (user -> number)
-- ARGV[1] user   ARGV[2] configured rate   ARGV[3] the sale's start (unix ms)
-- ARGV[4] a seed for the draw, used if the start passed and none was drawn yet
-- ARGV[5] expire-at (unix s)
--
-- Returns the queue state (see queue_reply) followed by the ticket number and 1 if it was
-- issued now, 0 if the user had it already.

local q, tickets = KEYS[1], KEYS[2]
local now = now_ms()
queue_init(q, ARGV[2], ARGV[3])
local s = queue_state(q)
queue_freeze(q, s, now, ARGV[4])
local n = redis.call('HGET', tickets, ARGV[1])
local fresh = '0'
if not n then
  -- The cursor caught up with everyone issued: start it again from here, so that a queue that
  -- was empty admits newcomers no faster than its rate.
  if now >= s.start and not (s.paused or s.held) and queue_cursor(s, now) >= s.seq then
    s.base = s.seq
    s.t0 = now
    redis.call('HSET', q, 'base', int(s.base), 't0', int(s.t0))
  end
  s.seq = redis.call('HINCRBY', q, 'seq', 1)
  n = tostring(s.seq)
  redis.call('HSET', tickets, ARGV[1], n)
  fresh = '1'
end
extend(q, ARGV[5])
extend(tickets, ARGV[5])
return queue_reply(s, now, {n, fresh})
