-- flashgate reserve: take `qty` units of one activity's stock for one user, atomically.
--
-- KEYS[1] stock key of the activity's current version   (integer: units remaining)
-- KEYS[2] per-user units hash of the activity            (field user -> units held)
-- KEYS[3] reservation record                              (hash, created here)
-- ARGV[1] user id          ARGV[2] qty (>= 1)       ARGV[3] per-user limit (units)
-- ARGV[4] stock version    ARGV[5] now (unix ms)    ARGV[6] expire-at (unix s) for KEYS[2..3]
--
-- Returns {code, remaining, held}:
--   1 reserved           remaining after deduction, units the user now holds
--  -1 no stock key       (not prewarmed yet, or lost)
--  -2 not enough stock   remaining now, units held
--  -3 per-user limit     remaining now, units held
--  -4 reservation id already used (never overwrite a record, even a tombstone)
--
-- O(1): no loops, every key in KEYS, all keys share the activity's hash tag.
-- Numbers are compared with tonumber: as strings "10" < "9".

local stock = redis.call('GET', KEYS[1])
if not stock then
  return {-1, 0, 0}
end
stock = tonumber(stock)
local qty = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')

if held + qty > limit then
  return {-3, stock, held}
end
if stock < qty then
  return {-2, stock, held}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {-4, stock, held}
end

local remaining = redis.call('DECRBY', KEYS[1], qty)
held = redis.call('HINCRBY', KEYS[2], ARGV[1], qty)
redis.call('HSET', KEYS[3],
  'user', ARGV[1], 'qty', qty, 'ver', ARGV[4], 'state', 'reserved', 'created_ms', ARGV[5])
redis.call('EXPIREAT', KEYS[2], ARGV[6])
redis.call('EXPIREAT', KEYS[3], ARGV[6])
return {1, remaining, held}
