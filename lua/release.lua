-- flashgate release: give a reservation's units back, atomically and exactly once.
-- (lib.lua is prepended: give_back.)
--
-- KEYS[1] reservations hash   KEYS[2] per-user units hash   KEYS[3] stock key of the version
-- KEYS[4] ledger of the version   KEYS[5] pending deadlines of the version   KEYS[6] event stream
-- ARGV[1] jti   ARGV[2] version the caller believes it belongs to   ARGV[3] now (unix ms)
-- ARGV[4] reason   ARGV[5] tombstone: 1 to mark an unknown id released (see below), else 0
-- ARGV[6] stream cap   ARGV[7] 1 if that version is the one on sale, else 0 (retired)
--
-- Returns {code, remaining}:
--   1 released from pending or confirmed; remaining in its version, -1 if its units were retired
--     (the version's key is gone, or the version is no longer on sale)
--   0 already released (nothing changes: exactly once)
--  -1 unknown reservation (with ARGV[5] = 1 a released tombstone is written, so that a reserve
--     still in flight with this id can never succeed later)
--  -2 version mismatch (nothing changes)

local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  if ARGV[5] == '1' then
    redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({
      state = 'released', user = '', qty = 0, ver = tonumber(ARGV[2]),
      released_ms = tonumber(ARGV[3]), reason = ARGV[4], tombstone = 1,
    }))
  end
  return {-1, -1}
end
local rec = cjson.decode(raw)
if rec.state == 'released' then
  return {0, -1}
end
if rec.ver ~= tonumber(ARGV[2]) then
  return {-2, -1}
end
return {1, give_back(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[6], ARGV[1], rec,
  ARGV[3], ARGV[4], ARGV[7])}
