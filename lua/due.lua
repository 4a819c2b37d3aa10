-- flashgate due: make a pending reservation due for the sweep (and its order lookup) no later
-- than `after` ms from now, by Redis's clock; the due time only moves earlier, and only for a
-- reservation still in the pending set. (lib.lua is prepended.)
--
-- KEYS[1] pending of the version   ARGV[1] jti   ARGV[2] after (ms)
-- Returns 1 moved, 0 not pending or already due sooner.

return redis.call('ZADD', KEYS[1], 'XX', 'LT', 'CH', int(now_ms() + tonumber(ARGV[2])), ARGV[1])
