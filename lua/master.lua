-- flashgate master check: the failover fence of one segment (see master_holds in lib.lua),
-- read by every gateway every second, and reset by an operator's resume. O(1).
-- (lib.lua is prepended.)
--
-- KEYS[1] the segment's master record
-- ARGV[1] the identity this gateway last saw accepted here ('' if none)
-- ARGV[2] expire-at (unix s)   ARGV[3] 'accept': record this master's identity (resume)
--
-- Returns {verdict, current, recorded}: verdict 'ok' (the record is this master's), 'armed'
-- (none was recorded, and the gateway's memory is empty or this master's: recorded now),
-- 'fenced' (another master's, or none recorded and the gateway remembers another) or
-- 'accepted' (ARGV[3]: recorded now, whatever was before).

local key = KEYS[1]
local holds, current, recorded = master_holds(key, ARGV[1])
local verdict
if ARGV[3] == 'accept' then
  redis.call('SET', key, current)
  verdict = 'accepted'
elseif not holds then
  verdict = 'fenced'
elseif not recorded then
  redis.call('SET', key, current)
  verdict = 'armed'
else
  verdict = 'ok'
end
if verdict ~= 'fenced' then
  extend(key, ARGV[2])
end
return {verdict, current, recorded or ''}
