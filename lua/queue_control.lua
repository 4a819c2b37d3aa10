-- flashgate queue control (admin API): pause or resume the cursor, or change the rate. The cursor
-- restarts from where it is, so no place is skipped or admitted twice. (lib.lua and
-- queue_lib.lua are prepended.) O(1).
--
-- KEYS[1] the queue hash
-- ARGV[1] pause | resume | rate   ARGV[2] the new rate (rate only)
--
-- Returns the queue state (see queue_reply), or an error for a queue never set up.

local q = KEYS[1]
if redis.call('EXISTS', q) == 0 then
  return redis.error_reply('no such queue')
end
local now = now_ms()
local s = queue_state(q)
queue_rebase(q, s, now)
if ARGV[1] == 'pause' then
  s.paused = true
  redis.call('HSET', q, 'paused', '1')
elseif ARGV[1] == 'resume' then
  s.paused = false
  redis.call('HSET', q, 'paused', '0')
elseif ARGV[1] == 'rate' then
  s.rate = tonumber(ARGV[2])
  redis.call('HSET', q, 'rate', ARGV[2])
else
  return redis.error_reply('unknown queue control ' .. ARGV[1])
end
queue_mark(q, s)
if s.stepped then
  -- A stepped queue's credit accrues only while it runs: none for the time before a resume.
  redis.call('HSET', q, 'tc', int(now))
end
return queue_reply(s, now)
