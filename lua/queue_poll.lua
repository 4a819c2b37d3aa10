-- flashgate queue poll, stepped admission only (see queue_step in queue_lib.lua): a ticket
-- holder's poll or purchase attempt records that its place is still watched, and learns the
-- place's fate; a purchase that won frees its place in `active`. (lib.lua and queue_lib.lua are
-- prepended.) O(1) (ZREM: O(log N)).
--
-- KEYS[1] seen (place -> last poll, ms)   KEYS[2] adm (place -> admitted at ms, or 's')
-- KEYS[3] active (ZSET place -> admitted at)
-- ARGV[1] poll | bought   ARGV[2] the place   ARGV[3] expire-at (unix s)
--
-- Returns the place's fate ('': not decided yet; 's': its turn was given away while its
-- ticket was absent; else when it was admitted, ms) and Redis's time (ms).

local now = now_ms()
local fate = redis.call('HGET', KEYS[2], ARGV[2])
if ARGV[1] == 'poll' then
  -- Only an undecided place's polls matter; a decided one's are not recorded.
  if not fate then
    redis.call('HSET', KEYS[1], ARGV[2], int(now))
    extend(KEYS[1], ARGV[3])
  end
elseif ARGV[1] == 'bought' then
  redis.call('ZREM', KEYS[3], ARGV[2])
else
  return redis.error_reply('unknown queue poll ' .. ARGV[1])
end
return {fate or '', int(now)}
