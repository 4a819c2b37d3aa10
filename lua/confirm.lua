-- flashgate confirm: pending reservations of one version become confirmed (the order exists),
-- each exactly once; up to a batch per call. (lib.lua is prepended.)
--
-- KEYS[1] res   KEYS[2] ledger of the version   KEYS[3] pending of the version   KEYS[4] events
-- KEYS[5] stock of the version   KEYS[6] users
-- ARGV[1] version   ARGV[2] via (upstream, admin, lookup)   ARGV[3] stream cap
-- ARGV[4..] reservation ids (the caller sends at most a bounded batch)
--
-- A reservation the backend itself says it took (via upstream: a 2xx to the forward; via
-- lookup: the order lookup found it) that was released meanwhile is a late acceptance: the
-- backend holds an order whose units went back on sale. It is a fact of the sale, recorded once
-- per reservation (flag l): the version's ledger counts late_accepted, and the units are covered
-- from the version's stock if it still has them (a confirmed cover record `<uuid>-late[.<n>]`
-- for the same user, counted in confirmed and the user's units, so that they cannot sell a
-- second time), or else counted oversold. An admin confirm of a released reservation is refused
-- (-3): the caller is told, and decides.
--
-- Returns one code per id: 1 confirmed, 0 already confirmed, -1 unknown, -2 version mismatch,
-- -3 released (too late: the units went back), -4 released, accepted late and covered from
-- stock, -5 released, accepted late and oversold (no stock left to cover it).

local now = int(now_ms())
local has_ledger = redis.call('EXISTS', KEYS[2]) == 1
local via = ARGV[2]

-- The backend took a released reservation: counted once, covered from stock if it can be.
local function accepted_late(jti, rec)
  rec.flags = rec.flags .. 'l'
  redis.call('HSET', KEYS[1], jti, encode(rec))
  local qty = tonumber(rec.qty)
  if has_ledger then
    redis.call('HINCRBY', KEYS[2], 'late_accepted', qty)
  end
  local stock = tonumber(redis.call('GET', KEYS[5]) or '-1')
  if stock >= qty then
    local base, segment = string.match(jti, '^(.*)(%.%d+)$')
    local cover = base and (base .. '-late' .. segment) or (jti .. '-late')
    local record = encode({state = 'confirmed', qty = rec.qty, ver = rec.ver, created = now,
      deadline = '', done = now, reason = 'late_accepted', flags = '', fence = '0', prior = '0',
      busy = '0', user = rec.user})
    if redis.call('HSETNX', KEYS[1], cover, record) == 1 then
      redis.call('DECRBY', KEYS[5], qty)
      if marked(KEYS[6]) then
        redis.call('HINCRBY', KEYS[6], rec.user, qty)
      end
      if has_ledger then
        redis.call('HINCRBY', KEYS[2], 'confirmed', qty)
      end
      emit(KEYS[4], ARGV[3], 'type', 'late_accept', 'jti', jti, 'user', rec.user, 'qty', rec.qty,
        'ver', rec.ver, 'via', via, 'covered_by', cover, 'ts', now)
      return -4
    end
  end
  if has_ledger then
    redis.call('HINCRBY', KEYS[2], 'oversold', qty)
  end
  emit(KEYS[4], ARGV[3], 'type', 'late_accept', 'jti', jti, 'user', rec.user, 'qty', rec.qty,
    'ver', rec.ver, 'via', via, 'covered_by', '', 'ts', now)
  return -5
end

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
    if via ~= 'admin' and not flagged(rec, 't') and not flagged(rec, 'l') then
      code = accepted_late(jti, rec)
    end
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
      'ver', rec.ver, 'via', via, 'ts', now)
    code = 1
  end
  out[#out + 1] = code
end
return out
