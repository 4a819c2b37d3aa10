-- flashgate confirm: a pending reservation becomes confirmed (the order exists), exactly once.
--
-- KEYS[1] reservations hash   KEYS[2] ledger of the version   KEYS[3] pending deadlines of the
-- version   KEYS[4] event stream
-- ARGV[1] jti   ARGV[2] version   ARGV[3] now (unix ms)   ARGV[4] stream cap   ARGV[5] via
--
-- Returns 1 confirmed, 0 already confirmed, -1 unknown, -2 version mismatch, -3 released.

local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return -1
end
local rec = cjson.decode(raw)
if rec.ver ~= tonumber(ARGV[2]) then
  return -2
end
if rec.state == 'confirmed' then
  return 0
end
if rec.state == 'released' then
  return -3
end
rec.state = 'confirmed'
rec.confirmed_ms = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(rec))
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'pending', -rec.qty)
  redis.call('HINCRBY', KEYS[2], 'confirmed', rec.qty)
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'type', 'confirm', 'jti', ARGV[1],
  'user', rec.user, 'qty', rec.qty, 'ver', rec.ver, 'via', ARGV[5], 'ts', ARGV[3])
return 1
