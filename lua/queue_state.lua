-- flashgate queue state: what every gateway keeps in memory to answer polls and admit tickets
-- without a Redis call per request; read every few hundred milliseconds. Also draws the
-- pre-queue at the start and holds the cursor while nothing is left to sell.
-- (lib.lua and queue_lib.lua are prepended.) O(1), but a stepped queue's resume (a halt key
-- gone without halt.lua): O(windows open at the halt), see queue_lengthen.
--
-- KEYS[1] the queue hash   KEYS[2] its tickets   KEYS[3] the activity's halt key (lua/halt.lua):
-- the cursor stands while it exists   KEYS[4..6] the stepped admission's seen, adm and active
-- (see queue_lib.lua)   KEYS[7] the stock key of the version on sale (unsegmented: same tag;
-- segmented: not passed, ARGV[6] says instead)
-- ARGV[1] configured rate   ARGV[2] the sale's start (unix ms)   ARGV[3] a random number (the
-- epoch of a queue set up now)
-- ARGV[4] expire-at (unix s)   ARGV[5] 1 to set the rate to ARGV[1] (a reload changed it)
-- ARGV[6] units left over all segments ('' for unsegmented: KEYS[7] is read)
-- ARGV[7] a random seed (64 hex digits) and ARGV[8] its commitment: the draw's, if none was
--         chosen yet (see queue_commit)
-- ARGV[9] '' for the time-function cursor (a queue already stepped keeps stepping, with no
-- absence check), else stepped (queue_step): skip_absent_after in ms (0: none)
-- ARGV[10] max_active (0: none)   ARGV[11] the admission window (ms, passed either way)
-- ARGV[12] 1 when a reload of this gateway moved the start (ARGV[2]), 2 when a reload applied it
-- unchanged, 0 otherwise: see queue_reschedule
--
-- Returns the queue state (see queue_reply) followed by the units left (-1: not known).

local q = KEYS[1]
local now = now_ms()
queue_init(q, KEYS[2], ARGV[1], ARGV[2], now, ARGV[3])
local s = queue_state(q)
queue_commit(q, s, ARGV[7], ARGV[8])
queue_reschedule(q, s, ARGV[2], now, ARGV[12])
queue_freeze(q, s, now)
queue_stand(q, s, 'halted', redis.call('EXISTS', KEYS[3]) == 1, now, {KEYS[5], KEYS[6]})
if ARGV[5] == '1' and tonumber(ARGV[1]) ~= s.rate then
  queue_rebase(q, s, now)
  s.rate = tonumber(ARGV[1])
  redis.call('HSET', q, 'rate', ARGV[1])
  queue_mark(q, s)
end
local left
if ARGV[6] ~= '' then
  left = tonumber(ARGV[6])
else
  left = tonumber(redis.call('GET', KEYS[7]) or '-1')
end
-- A stock key that does not exist (not prewarmed yet) says nothing: left as it is.
if left >= 0 then
  queue_stand(q, s, 'held', left == 0, now)
end
-- A stepped queue's cursor moves only by queue_step: once stepped it stays stepped, and a
-- configuration without either key (a reload removed them) walks it with no absence check and
-- no limit, rather than freezing it.
if ARGV[9] ~= '' or s.stepped then
  queue_step(q, s, {KEYS[4], KEYS[5], KEYS[6]}, now, tonumber(ARGV[9]) or 0,
    tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[4])
end
extend(q, ARGV[4])
return queue_reply(s, now, {int(left)})
