-- flashgate queue tickets: each user's ticket number for an activity's waiting room, issued
-- once (asking again returns the same number), for a batch of users in one call: the queue's
-- bookkeeping (set-up, draw commitment, postponement, the draw's freeze, the clock and the
-- expiries) runs once per call, then each ask in order, each answered exactly as if it had
-- come alone at this call's time. (lib.lua and queue_lib.lua are prepended.) O(asks).
--
-- KEYS[1] the queue hash   KEYS[2] its tickets (user -> number)   KEYS[3] the stepped
-- admission's seen (place -> last poll): a ticket issued to a stepped queue after the draw
-- counts as seen now   KEYS[4..] the proof-of-work solutions' keys the asks spend (each
-- spent here, once: SET NX until its expiry)
-- ARGV[1] configured rate   ARGV[2] the sale's start (unix ms)
-- ARGV[3] a random number: the queue's epoch if it is set up now   ARGV[4] expire-at (unix s)
-- ARGV[5] the queue opens, ARGV[6] the sale closes (unix ms): no ticket is issued outside
--         [opens, closes) by Redis's clock, whatever the clock of the gateway that asks
-- ARGV[7] a random seed (64 hex digits) and ARGV[8] its commitment: the draw's, if none was
--         chosen yet (see queue_commit)
-- Then 5 arguments an ask: the user; the index in KEYS of the solution it spends (0: none);
-- until when the solution could be sent (unix ms); '1' refuses a spent one (else, shadow
-- mode, it is only reported); the queue epoch the solution is bound to. Expired by Redis's
-- clock or of another epoch counts as spent: the gateway checked both against its last read
-- of Redis, and a SET NX PXAT in the past writes nothing (the same solution would pass again
-- and again).
--
-- Returns the queue state after the batch (see queue_reply), then either 0 and 'early' (the
-- queue is not open yet) or 0 and 'late' (the sale closed), when nothing was issued to anyone;
-- or three values an ask: the ticket number, 1 if it was issued now (0: the user had it
-- already), and 1 if the solution given was spent before (else 0); or 0, 'used', 0 (a spent
-- solution, enforced: no ticket). Numbers grow with arrival (FIFO after the start) but may
-- skip: see below.

local q, tickets = KEYS[1], KEYS[2]
local now = now_ms()
queue_init(q, tickets, ARGV[1], ARGV[2], now, ARGV[3])
local s = queue_state(q)
queue_commit(q, s, ARGV[7], ARGV[8])
queue_reschedule(q, s, ARGV[2], now, '0')
queue_freeze(q, s, now)
if now < tonumber(ARGV[5]) then
  return queue_reply(s, now, {'0', 'early'})
end
if now >= tonumber(ARGV[6]) then
  return queue_reply(s, now, {'0', 'late'})
end
local out = {}
local seq0 = s.seq
local first, solved = nil, 0
local stepped_seen = s.stepped and s.drawn
-- The cursor passed everyone issued (the queue ran empty): the next number is the next place
-- the cursor reaches, so a newcomer waits its turn at the rate like anyone, and the cursor never
-- moves back (a ticket that lapsed stays lapsed). Numbers skipped are places nobody holds. The
-- cursor is read at this call's time: once a number is issued it is past it for the batch.
local cursor = queue_cursor(s, now)
for i = 9, #ARGV, 5 do
  local spent, used = '0', false
  local k = tonumber(ARGV[i + 1])
  if k > 0 then
    local until_ms = ARGV[i + 2]
    local stale = now >= tonumber(until_ms) or ARGV[i + 4] ~= s.epoch
    if stale or not redis.call('SET', KEYS[k], '1', 'NX', 'PXAT', until_ms) then
      if ARGV[i + 3] == '1' then
        used = true
      end
      spent = '1'
    else
      solved = solved + 1
    end
  end
  if used then
    out[#out + 1] = '0'
    out[#out + 1] = 'used'
    out[#out + 1] = '0'
  else
    local user = ARGV[i]
    local n = redis.call('HGET', tickets, user)
    local fresh = '0'
    if not n then
      if cursor > s.seq then
        s.seq = cursor
      end
      s.seq = s.seq + 1
      n = int(s.seq)
      first = first or n
      redis.call('HSET', tickets, user, n)
      fresh = '1'
      -- Only once drawn: a pre-queue ticket's number is not its place (queue_step counts the
      -- drawn places as seen at the start).
      if stepped_seen then
        redis.call('HSET', KEYS[3], n, int(now))
      end
    end
    out[#out + 1] = n
    out[#out + 1] = fresh
    out[#out + 1] = spent
  end
end
if solved > 0 then
  redis.call('HINCRBY', q, 'solved', solved)
end
if s.seq ~= seq0 then
  -- The numbers first..seq were issued now (no number is skipped after a call's first: the
  -- cursor is read once, above): a:<first> records when, in the same write.
  redis.call('HSET', q, 'seq', int(s.seq), 'a:' .. first, int(now))
  if stepped_seen then
    extend(KEYS[3], ARGV[4])
  end
end
extend(q, ARGV[4])
extend(tickets, ARGV[4])
return queue_reply(s, now, out)
