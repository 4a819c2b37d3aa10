-- flashgate due: a forward that ended without the backend's answer asks for its reservation to
-- be settled (its order lookup) `after` ms from now, by Redis's clock, but never while another
-- forward of it may still be at the backend. (lib.lua is prepended.)
--
-- KEYS[1] pending of the version   KEYS[2] res
-- ARGV[1] jti   ARGV[2] after (ms)   ARGV[3] the fence the asking forward got (see lib.lua)
--
-- Only while the record is pending and its fence is still the asker's (no forward, replay or
-- hand-out since: a later forward's trip, or a lookup already out, governs instead), and never
-- before the trips of the forwards before the asker end (prior). The due time only moves
-- earlier. Returns 1 moved, 0 not pending, fenced, or already due sooner.

local rec = decode(redis.call('HGET', KEYS[2], ARGV[1]))
if not rec or rec.state ~= 'pending' or rec.fence ~= ARGV[3] then
  return 0
end
local at = math.max(now_ms() + tonumber(ARGV[2]), tonumber(rec.prior))
return redis.call('ZADD', KEYS[1], 'XX', 'LT', 'CH', int(at), ARGV[1])
