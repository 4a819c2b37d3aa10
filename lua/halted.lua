-- flashgate halted: whether an activity is halted (lua/halt.lua), read by every gateway every
-- 100 ms. A halt's key has its expiry moved to the sale's end plus the retention when that is
-- later (an end extended by a reload never lets a halt lapse before the sale's other keys).
-- (lib.lua is prepended.) O(1).
--
-- KEYS[1] the halt key   ARGV[1] expire-at (unix s)
--
-- Returns since when the activity is halted (unix ms), or 0 when it is not.

local since = redis.call('GET', KEYS[1])
if not since then
  return 0
end
extend(KEYS[1], ARGV[1])
return tonumber(since)
