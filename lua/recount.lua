-- flashgate recount: an operator's count of a version's remaining stock, set in one segment of a
-- store that forgot what it sold (emptied, an older snapshot, a key lost), once, in the ledger
-- and the event stream; the segment then sells again (`POST /v1/activities/{act}/resume` with
-- `{"remaining": N}`, see src/stock/segments/recount.rs). (lib.lua is prepended.)
--
-- What the store still holds is kept; what it lost is made again, empty, with its expiry: the
-- placeholders, the event stream, the version's ledger (initial: the configured share), the
-- meta's record of the version on sale. A records hash that lost its placeholder (the hash
-- itself gone, or the field removed) can no longer be trusted to match the ledgers: each
-- ledger's pending, confirmed, released, retired and held_in_doubt are counted again from the
-- records it still holds (O(records): an operator's call, made while the segment sells
-- nothing). Every ledger's `recounted` then takes the difference, so that
--   initial + moved_in - moved_out + restocked ==
--     remaining + pending + confirmed + retired + recounted
-- holds again, and the event `recount` says by how much the version's moved. The segment's
-- records start a new life (the counts gateways saw before it say nothing of it: see
-- records_of in lib.lua), its loss is lifted, and the master answering now is accepted. A
-- users hash that lost its placeholder is made again from the records still held (each buyer's
-- pending and confirmed units): a buyer whose records are gone too can buy again up to the
-- limit (the store kept nothing to tell; the backend's orders do).
--
-- KEYS[1] meta   KEYS[2] stock of the version   KEYS[3] its ledger   KEYS[4] its pending
-- KEYS[5] users   KEYS[6] res   KEYS[7] idem   KEYS[8] events   KEYS[9] transfers
-- KEYS[10] received   KEYS[11] acknowledged transfers   KEYS[12] known   KEYS[13] the master
-- record   KEYS[14..] the ledger of each other version the segment lists (ARGV[8..])
-- ARGV[1] version   ARGV[2] the units this segment sells from now   ARGV[3] the configured share
-- of this segment (a ledger made again starts from it)   ARGV[4] expire-at (unix s)
-- ARGV[5] stream cap   ARGV[6] the operator's count for the whole activity (recorded)
-- ARGV[7] the newest life of the segment's records the calling gateway saw ('' none): the new
-- life starts after it and after any life the known hash names (see new_life in lib.lua)
-- ARGV[8] the loss stamp the caller read before it took the activity's recount claim
-- (src/stock/scripts/recount.rs: known's `lost`, `fenced_at` and `recount`, joined by '/'):
-- a recount settles the loss it read, once. Every recount writes a new `recount` stamp, so a
-- second recount that read the segment before the first ran is refused here, atomically.
-- ARGV[9..] the other versions
--
-- Returns {1, life, remaining, moved, birth}: birth = when the version went on sale here (unix
-- ms: kept if the meta still knew, else now); moved = what this recount added to the version's
-- `recounted` (units taken off sale; negative: put on sale); {-2, current}: a newer version is
-- on sale here; {-3, current}: another version is on sale here (the configured one never was);
-- {-4, ''}: a variant's lane whose buyers' units (the activity's, shared by its variants) are
-- lost: a count of one variant cannot rebuild them (nothing changed); {-5, stamp}: the segment
-- no longer carries the loss stamp the caller read (recounted since, or another loss found):
-- nothing changed.
--
-- A version's ledger that is gone while its stock is there (deleted by hand, or lost: the
-- reserve refuses the segment as damaged, -6, and the prewarm marks it lost) is made again
-- with `initial` = the share, and its counts are taken from the records the segment holds, as
-- when the records are suspect, so the ledger balances and its pending matches the records.

local META, STOCK, LEDGER, PENDING, USERS, RES, IDEM, EVENTS, TRANSFERS, RECEIVED, ACKED, KNOWN,
  RECORD = unpack(KEYS, 1, 13)
local version, units, share, expire_at = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local OTHER_VERSIONS = 9

-- The loss the caller read, still the one this segment carries?
local k = redis.call('HMGET', KNOWN, 'lost', 'fenced_at', 'recount')
local stamp = (k[1] or '') .. '/' .. (k[2] or '') .. '/' .. (k[3] or '')
if stamp ~= ARGV[8] then
  return {-5, stamp}
end

local current = redis.call('HGET', META, 'current')
if current and tonumber(current) > tonumber(version) then
  return {-2, current}
end
if current and current ~= version then
  return {-3, current}
end
local now = now_ms()

-- What the records still held say, per version: {pending, confirmed, released, retired,
-- held_in_doubt}.
local suspect = not marked(RES)
-- The version's ledger gone (its stock there or not): made again below, counted from the
-- records.
local ledger_lost = redis.call('EXISTS', LEDGER) == 0
local users_lost = not marked(USERS)
-- A variant's lane shares the buyers' units with the activity's other variants (USERS is not
-- under this lane's base, see src/stock/keys.rs): rebuilt from this lane's records alone, it
-- would forget their units in the other variants and let them pass the per-user limit.
local shared = string.sub(RES, 1, #RES - #':res') ~= string.sub(USERS, 1, #USERS - #':users')
if users_lost and shared then
  return {-4, ''}
end
local counted = {}
if users_lost then
  redis.call('DEL', USERS)
  redis.call('HSET', USERS, '', '')
  local all = redis.call('HGETALL', RES)
  for i = 1, #all, 2 do
    local r = all[i] ~= '' and decode(all[i + 1])
    if r and not flagged(r, 't') and (r.state == 'pending' or r.state == 'confirmed') then
      redis.call('HINCRBY', USERS, r.user, tonumber(r.qty))
    end
  end
end
if suspect or ledger_lost then
  local all = redis.call('HGETALL', RES)
  for i = 1, #all, 2 do
    local r = all[i] ~= '' and decode(all[i + 1])
    if r and not flagged(r, 't') then
      local c = counted[r.ver] or {0, 0, 0, 0, 0}
      local q = tonumber(r.qty)
      if r.state == 'pending' then
        c[1] = c[1] + q
        if flagged(r, 'd') then
          c[5] = c[5] + q
        end
      elseif r.state == 'confirmed' then
        c[2] = c[2] + q
      else
        c[3] = c[3] + q
        if flagged(r, 'x') then
          c[4] = c[4] + q
        end
      end
      counted[r.ver] = c
    end
  end
end

for _, key in ipairs({USERS, IDEM, TRANSFERS, RECEIVED, ACKED}) do
  redis.call('HSETNX', key, '', '')
end
local hw_life = string.match(redis.call('HGET', KNOWN, 'hw') or '', '^(.*)|%d+$') or ''
local after = newer_of(newer_of(ARGV[7], hw_life), redis.call('HGET', RES, '') or '')
local life = new_life(after)
redis.call('HSET', RES, '', life)
redis.call('ZADD', PENDING, 'NX', '+inf', '')
if redis.call('EXISTS', EVENTS) == 0 then
  redis.call('XADD', EVENTS, 'MAXLEN', '0', '*', 'type', 'init')
end
if redis.call('EXISTS', LEDGER) == 0 then
  local ledger = {}
  for _, field in ipairs(LEDGER_FIELDS) do
    ledger[#ledger + 1] = field
    ledger[#ledger + 1] = field == 'initial' and share or '0'
  end
  redis.call('HSET', LEDGER, unpack(ledger))
end

-- Counts the ledger of version `ver` again from the records (when they are suspect), and sets
-- its `recounted` to what balances it with `left` units in stock. Returns what it moved.
local function rebalance(ledger, ver, left, made)
  if redis.call('EXISTS', ledger) == 0 then
    return 0
  end
  if suspect or made then
    local c = counted[ver] or {0, 0, 0, 0, 0}
    local unsold = tonumber(redis.call('HGET', ledger, 'unsold_retired') or '0')
    redis.call('HSET', ledger, 'pending', int(c[1]), 'confirmed', int(c[2]), 'released',
      int(c[3]), 'retired', int(unsold + c[4]), 'held_in_doubt', int(c[5]))
  end
  local l = redis.call('HMGET', ledger, 'initial', 'moved_in', 'moved_out', 'restocked',
    'pending', 'confirmed', 'retired', 'recounted')
  local n = {}
  for i = 1, 8 do
    n[i] = tonumber(l[i] or '0')
  end
  local recounted = n[1] + n[2] - n[3] + n[4] - (left + n[5] + n[6] + n[7])
  redis.call('HSET', ledger, 'recounted', int(recounted))
  return recounted - n[8]
end

for i = 14, #KEYS do
  rebalance(KEYS[i], ARGV[OTHER_VERSIONS + i - 14], 0, false)
end
local was = tonumber(redis.call('GET', STOCK) or '0')
local moved = rebalance(LEDGER, version, units, ledger_lost)
redis.call('SET', STOCK, int(units))
redis.call('HSET', META, 'current', version)
redis.call('HSETNX', META, 'v:' .. version, int(now))
redis.call('HDEL', KNOWN, 'lost', 'hw', 'fenced_at')
-- The recount stamp: always a new one (later than the last, even within one ms), so the loss
-- stamp a second recount read before this one never matches again.
local at = now
local last_at = tonumber(string.match(k[3] or '', '|(%d+)$') or '')
if last_at and last_at >= at then
  at = last_at + 1
end
-- And never older than the version's birth it settles: a birth stamped by a master whose clock
-- ran ahead (before a failover, or an NTP step back) would otherwise still read as made again
-- after this recount (master.lua's born_again, the prewarm's check), and the loss would stand.
local birth = tonumber(redis.call('HGET', META, 'v:' .. version) or '')
if birth and birth >= at then
  at = birth + 1
end
redis.call('HSET', KNOWN, 'recount', ARGV[6] .. '|' .. int(at), 'life', life)
redis.call('SET', RECORD, replid_in(redis.call('INFO', 'replication')))
redis.call('XADD', EVENTS, 'MAXLEN', '~', ARGV[5], '*', 'type', 'recount', 'ver', version,
  'remaining', int(units), 'was', int(was), 'recounted', int(moved), 'ts', int(now))
for _, key in ipairs(KEYS) do
  extend(key, expire_at)
end
return {1, life, units, moved, redis.call('HGET', META, 'v:' .. version)}
