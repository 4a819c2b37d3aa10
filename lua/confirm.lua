-- flashgate confirm: pending reservations of one version become confirmed (the order exists),
-- each exactly once; up to a batch per call. (lib.lua is prepended.)
--
-- KEYS[1] res   KEYS[2] ledger of the version   KEYS[3] pending of the version   KEYS[4] events
-- ARGV[1] version   ARGV[2] via (upstream, admin, lookup)   ARGV[3] stream cap
-- ARGV[4..] reservation ids (the caller sends at most a bounded batch)
--
-- Returns one code per id: 1 confirmed, 0 already confirmed, -1 unknown, -2 version mismatch,
-- -3 released (too late: the units went back).

local now = int(now_ms())
local has_ledger = redis.call('EXISTS', KEYS[2]) == 1
local out = {}
for i = 4, #ARGV do
  local jti = ARGV[i]
  local rec = decode(redis.call('HGET', KEYS[1], jti))
  local code
  if not rec then
    code = -1
  elseif rec.ver ~= ARGV[1] then
    code = -2
  elseif rec.state == 'confirmed' then
    code = 0
  elseif rec.state == 'released' then
    code = -3
  else
    rec.state = 'confirmed'
    rec.done = now
    redis.call('HSET', KEYS[1], jti, encode(rec))
    if has_ledger then
      redis.call('HINCRBY', KEYS[2], 'pending', -tonumber(rec.qty))
      redis.call('HINCRBY', KEYS[2], 'confirmed', rec.qty)
    end
    redis.call('ZREM', KEYS[3], jti)
    emit(KEYS[4], ARGV[3], 'type', 'confirm', 'jti', jti, 'user', rec.user, 'qty', rec.qty,
      'ver', rec.ver, 'via', ARGV[2], 'ts', now)
    code = 1
  end
  out[#out + 1] = code
end
return out
