-- flashgate reserve: take `qty` units of one activity's stock for one user, atomically, and
-- record the reservation (ledger, pending deadline, event) in the same step.
--
-- KEYS[1] stock key of the current version     KEYS[2] per-user units hash of the activity
-- KEYS[3] reservations hash of the activity    KEYS[4] ledger of the current version
-- KEYS[5] pending deadlines of the version     KEYS[6] idempotency hash of the activity
-- KEYS[7] event stream of the activity
-- ARGV[1] user   ARGV[2] qty (>= 1)   ARGV[3] per-user limit (units)   ARGV[4] version
-- ARGV[5] now (unix ms)   ARGV[6] expire-at (unix s)   ARGV[7] reservation id (jti)
-- ARGV[8] hold deadline (unix ms)   ARGV[9] idempotency field ("" for none)   ARGV[10] stream cap
--
-- Returns:
--   {1, remaining, held}            reserved
--   {2, remaining, qty, jti, ver}   idempotent replay: the reservation this key already won
--  {-1, 0, 0}                       no stock key (not prewarmed yet, or lost)
--  {-2, remaining, held}            not enough stock
--  {-3, remaining, held}            per-user limit
--  {-4, remaining, held}            reservation id already used (never overwrite a record)
--
-- O(1): no loops, every key in KEYS, all keys share the activity's hash tag.
-- Numbers are compared with tonumber: as strings "10" < "9".

if ARGV[9] ~= '' then
  local previous = redis.call('HGET', KEYS[6], ARGV[9])
  if previous then
    local raw = redis.call('HGET', KEYS[3], previous)
    if raw then
      local rec = cjson.decode(raw)
      if rec.state ~= 'released' then
        local left = tonumber(redis.call('GET', KEYS[1]) or '-1')
        return {2, left, rec.qty, previous, rec.ver}
      end
    end
  end
end

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
if redis.call('HEXISTS', KEYS[3], ARGV[7]) == 1 then
  return {-4, stock, held}
end

local remaining = redis.call('DECRBY', KEYS[1], qty)
held = redis.call('HINCRBY', KEYS[2], ARGV[1], qty)
redis.call('HSET', KEYS[3], ARGV[7], cjson.encode({
  state = 'pending', user = ARGV[1], qty = qty, ver = tonumber(ARGV[4]),
  created_ms = tonumber(ARGV[5]), deadline_ms = tonumber(ARGV[8]),
}))
redis.call('HINCRBY', KEYS[4], 'pending', qty)
redis.call('ZADD', KEYS[5], ARGV[8], ARGV[7])
if ARGV[9] ~= '' then
  redis.call('HSET', KEYS[6], ARGV[9], ARGV[7])
  redis.call('EXPIREAT', KEYS[6], ARGV[6])
end
redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[10], '*', 'type', 'reserve', 'jti', ARGV[7],
  'user', ARGV[1], 'qty', qty, 'ver', ARGV[4], 'ts', ARGV[5])
for _, i in ipairs({2, 3, 5, 7}) do
  redis.call('EXPIREAT', KEYS[i], ARGV[6])
end
return {1, remaining, held}
