-- flashgate reserve: take units of one segment's stock for a batch of buyers, atomically, and
-- record each reservation (ledger, hold deadline, event) in the same step. (lib.lua is prepended.)
-- The items are judged one after another exactly as separate calls in that order would be (each
-- sees what the ones before it took: stock, per-user units, ids, idempotency keys), with one
-- TIME for the batch (read when the first item needs it: as if they all arrived then), and each
-- item's own record, pending entry, ledger count and event, written as it is judged (a later
-- item's error leaves the ones before it whole, and a deposit after a reserve sees its ledger,
-- as separate calls would). A batch of one is the single reserve.
--
-- KEYS[1] stock of the version   KEYS[2] users (units held, all versions)   KEYS[3] res (records)
-- KEYS[4] ledger of the version  KEYS[5] pending of the version (jti -> when due)
-- KEYS[6] idem (user "\n" Idempotency-Key -> jti)   KEYS[7] events   KEYS[8] received transfers
-- ARGV[1] version   ARGV[2] stream cap; then 12 per item, item i's a[j] = ARGV[2 + 12(i-1) + j]:
-- a[1] user   a[2] qty (>= 1)   a[3] per-user limit (units)   a[4] reservation id (jti)
-- a[5] hold (ms)   a[6] idempotency field ('' for none)
-- a[7] transfer id to deposit first ('' for none)   a[8] its units
-- a[9] in flight (ms): the longest a forwarded request may take; the reservation is not due
--      for the sweep before that long from now, even when its hold is shorter, so a request
--      still at the backend never has its units released under it
-- a[10] '1': replay only (a waiting room refused the buyer a new purchase): answer the
--      key's reservation if it has one, else -8 and change nothing
-- a[11] the sale opens, a[12] it closes (unix ms): no new reservation outside
--      [opens, closes) by Redis's clock, whatever the clock of the gateway that asks
--
-- Returns one reply per item, in order; an item's reply (times in ms, Redis's clock; fence: the record's fence once this request's forward is
-- counted, which an early order lookup it asks for must name, see lib.lua):
--   {1, remaining, held, created, deadline, fence}   reserved
--   {2, remaining, qty, jti, ver, created, deadline, fence}   idempotent replay: the
--                                    reservation this key already won (now flagged r: the
--                                    request that made it can no longer release it; if pending,
--                                    forwarded again: the fence moves and it is not due before
--                                    this forward's trip ends)
--  {-1, 0, 0}                        no stock key (not prewarmed yet, or the version is retired)
--  {-2, remaining, held}             not enough stock
--  {-3, remaining, held}             per-user limit
--  {-4, remaining, held}             reservation id already used (never overwrite a record)
--  {-5, 0, 0}                        the key's reservation is pending past its hold deadline: it
--                                    is being settled (expiry or order lookup), never replayed
--  {-6, 0, 0}                        the segment lost a key it had (users or res): refused
--  {-7, code, 0}                     the transfer to deposit first could not land (deposit's
--                                    code: -1 no ledger of its version, -2 received book lost);
--                                    nothing changed, the transfer stays in flight
--  {-8, 0, 0}                        replay only, and the key won nothing: nothing changed
--  {-9, 0, 0}                        the sale has not opened yet (Redis's clock): nothing changed
-- {-10, 0, 0}                        the sale has closed (Redis's clock): nothing changed
-- {-11, qty, 0}                      the key's reservation is for another quantity (qty): this
--                                    request is not its retry; nothing changed
-- {-12, ver, 0}                      the key's reservation is pending under another version
--                                    (ver), whose pending set is not in KEYS: ask again, replay
--                                    only, with that version's keys; nothing changed
--
-- O(items): a loop over the batch (at most 32 items, the gateway's bound), O(1) per item; every
-- key in KEYS, all keys share the segment's hash tag.
-- Numbers are compared with tonumber: as strings "10" < "9".

local VER, MAXLEN = ARGV[1], ARGV[2]
local ITEM_ARGS = 12
local prewarmed = marked(KEYS[2]) and marked(KEYS[3])
local clock
local function now()
  if not clock then
    clock = now_ms()
  end
  return clock
end
local events_exist
local function event(...)
  if events_exist == nil then
    events_exist = redis.call('EXISTS', KEYS[7]) == 1
  end
  if events_exist then
    redis.call('XADD', KEYS[7], 'MAXLEN', '~', MAXLEN, '*', ...)
  end
end

-- The key's reservation, answered again; nil if it has none that is not released.
local function replay(a, field)
  local previous = redis.call('HGET', KEYS[6], field)
  local rec = previous and decode(redis.call('HGET', KEYS[3], previous))
  if not rec or rec.state == 'released' then
    return nil
  end
  if rec.state == 'pending' and tonumber(rec.deadline) <= now() then
    return {-5, 0, 0}
  end
  if rec.qty ~= a[2] then
    -- A retry asking for another quantity is not the same purchase: never forwarded with the
    -- first one's claims.
    return {-11, tonumber(rec.qty), 0}
  end
  if rec.state == 'pending' and rec.ver ~= VER then
    -- Its due time lives in its own version's pending set: moved there, or not at all.
    return {-12, tonumber(rec.ver), 0}
  end
  local changed = not flagged(rec, 'r')
  if changed then
    rec.flags = rec.flags .. 'r'
  end
  if rec.state == 'pending' then
    -- Forwarded again: the fence moves (a lookup answer asked before this is discarded), and
    -- it is not due while this request may still be at the backend.
    forwarded(rec, now(), tonumber(a[9]))
    redis.call('ZADD', KEYS[5], 'XX', 'GT', rec.busy, previous)
    changed = true
  end
  if changed then
    redis.call('HSET', KEYS[3], previous, encode(rec))
  end
  return {2, tonumber(redis.call('GET', KEYS[1]) or '-1'), tonumber(rec.qty), previous, rec.ver,
    rec.created, rec.deadline, rec.fence}
end

local function reserve(a)
  if not prewarmed then
    -- Never prewarmed here (no stock key either), or damaged.
    if redis.call('EXISTS', KEYS[1]) == 0 then
      return {-1, 0, 0}
    end
    return {-6, 0, 0}
  end
  if a[7] ~= '' then
    local landed = deposit({stock = KEYS[1], ledger = KEYS[4], received = KEYS[8]}, a[7], a[8])
    if landed < 0 then
      return {-7, landed, 0}
    end
  end
  if a[6] ~= '' then
    local replayed = replay(a, a[6])
    if replayed then
      return replayed
    end
  end
  if a[10] == '1' then
    return {-8, 0, 0}
  end

  local stock = redis.call('GET', KEYS[1])
  if not stock then
    return {-1, 0, 0}
  end
  stock = tonumber(stock)
  local qty = tonumber(a[2])
  local held = tonumber(redis.call('HGET', KEYS[2], a[1]) or '0')
  if held + qty > tonumber(a[3]) then
    return {-3, stock, held}
  end
  if stock < qty then
    return {-2, stock, held}
  end
  -- A replay above still answers what the key won; nothing new is taken outside the sale's
  -- hours (checked last: refusals above cost no TIME call). A transfer deposited above stays: it
  -- only moved units between segments of one version.
  local t = now()
  if t < tonumber(a[11]) then
    return {-9, 0, 0}
  end
  if t >= tonumber(a[12]) then
    return {-10, 0, 0}
  end
  local deadline = int(t + tonumber(a[5]))
  local rec = {state = 'pending', qty = a[2], ver = VER, created = int(t), deadline = deadline,
    done = '', reason = '', flags = '', fence = '0', prior = '0', busy = '0', user = a[1]}
  forwarded(rec, t, tonumber(a[9]))
  if redis.call('HSETNX', KEYS[3], a[4], encode(rec)) == 0 then
    return {-4, stock, held}
  end

  local remaining = redis.call('DECRBY', KEYS[1], qty)
  held = redis.call('HINCRBY', KEYS[2], a[1], qty)
  redis.call('HINCRBY', KEYS[4], 'pending', qty)
  redis.call('ZADD', KEYS[5], int(math.max(tonumber(deadline), tonumber(rec.busy))), a[4])
  if a[6] ~= '' then
    redis.call('HSET', KEYS[6], a[6], a[4])
  end
  event('type', 'reserve', 'jti', a[4], 'user', a[1], 'qty', a[2], 'ver', VER, 'ts', int(t))
  return {1, remaining, held, int(t), deadline, rec.fence}
end

local replies = {}
for base = 2, #ARGV - ITEM_ARGS, ITEM_ARGS do
  replies[#replies + 1] = reserve({unpack(ARGV, base + 1, base + ITEM_ARGS)})
end
return replies
