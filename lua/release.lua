-- flashgate release: give a reservation's units back, atomically and exactly once.
--
-- KEYS[1] reservation record
-- KEYS[2] per-user units hash of the activity
-- KEYS[3] stock key of the version the gateway believes the reservation belongs to
-- ARGV[1] that version     ARGV[2] now (unix ms)     ARGV[3] reason
-- ARGV[4] tombstone expire-at (unix s), or 0: when the record does not exist, write a released
--         tombstone so that a reserve still in flight with this id can never succeed later.
--
-- Returns {code, remaining}:
--   1 released           remaining after the return, or -1 if the stock key is gone
--   0 already released   (nothing changes: exactly once)
--  -1 unknown reservation (a tombstone was written if ARGV[4] > 0)
--  -2 version mismatch   (KEYS[3] is not the reservation's stock key; nothing changes)
--
-- Stock is never resurrected from nothing: units go back only into a stock key that still
-- exists (INCRBY on a missing key would create stock out of thin air).

local rec = redis.call('HMGET', KEYS[1], 'state', 'ver', 'qty', 'user')
local state, ver, qty, user = rec[1], rec[2], rec[3], rec[4]

if not state then
  local tombstone_until = tonumber(ARGV[4])
  if tombstone_until > 0 then
    redis.call('HSET', KEYS[1], 'state', 'released', 'reason', ARGV[3], 'released_ms', ARGV[2],
      'qty', 0, 'ver', ARGV[1])
    redis.call('EXPIREAT', KEYS[1], tombstone_until)
  end
  return {-1, -1}
end
if state == 'released' then
  return {0, -1}
end
if ver ~= ARGV[1] then
  return {-2, -1}
end

qty = tonumber(qty)
redis.call('HSET', KEYS[1], 'state', 'released', 'reason', ARGV[3], 'released_ms', ARGV[2])
if redis.call('HINCRBY', KEYS[2], user, -qty) <= 0 then
  redis.call('HDEL', KEYS[2], user)
end
local remaining = -1
if redis.call('EXISTS', KEYS[3]) == 1 then
  remaining = redis.call('INCRBY', KEYS[3], qty)
  redis.call('HSET', KEYS[1], 'returned', 1)
else
  redis.call('HSET', KEYS[1], 'returned', 0)
end
return {1, remaining}
