-- flashgate sweep: release pending reservations of one version whose hold deadline has passed.
-- (lib.lua is prepended: give_back.) Bounded: at most ARGV[2] reservations per call; the caller
-- calls again while a full batch came back. Any number of instances may sweep at once: a
-- reservation is released only while pending, so exactly once.
--
-- KEYS[1] pending deadlines of the version   KEYS[2] reservations hash   KEYS[3] per-user units
-- KEYS[4] stock key of the version   KEYS[5] ledger of the version   KEYS[6] event stream
-- ARGV[1] now (unix ms)   ARGV[2] batch size   ARGV[3] stream cap
-- ARGV[4] 1 if the version is the one on sale, else 0 (units of a retired version are retired)
--
-- Returns {released, units, scanned, retired (released into a version whose stock key is gone)}.

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local released, units, retired = 0, 0, 0
for _, jti in ipairs(due) do
  local raw = redis.call('HGET', KEYS[2], jti)
  local rec = raw and cjson.decode(raw)
  if rec and rec.state == 'pending' then
    local left = give_back(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[1], KEYS[6], ARGV[3], jti, rec,
      ARGV[1], 'expired', ARGV[4])
    if left < 0 then
      retired = retired + 1
    end
    released = released + 1
    units = units + rec.qty
  else
    redis.call('ZREM', KEYS[1], jti)
  end
end
return {released, units, #due, retired}
