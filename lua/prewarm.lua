-- flashgate prewarm: put a version of an activity on sale in one segment, once, and keep every
-- key of the segment alive until the sale's end plus the retention. (lib.lua is prepended.)
--
-- KEYS[1] meta   KEYS[2] stock of the version   KEYS[3] its ledger   KEYS[4] its pending
-- KEYS[5] users   KEYS[6] res   KEYS[7] idem   KEYS[8] events   KEYS[9] transfers
-- KEYS[10] received   KEYS[11] acknowledged transfers   KEYS[12] known (what the gateways know
-- the segment must hold, see master.lua)   KEYS[13] the master record   KEYS[14..] stock, ledger
-- and pending of each other version the segment has had (ARGV[9..], in that order)
-- KEYS[#KEYS] the book of restocks (only its expiry is moved, with every other key's)
-- ARGV[1] version   ARGV[2] the version the caller read as on sale here ('' none)
-- ARGV[3] units of this segment   ARGV[4] expire-at (unix s)
-- ARGV[5] '1': the activity's base meta records this segment as made before (`made:<n>`): a
--         segment with nothing in it then lost every key (a Redis Cluster master that restarted
--         empty), and is refused as damaged instead of being put on sale again
-- ARGV[6] '1': the calling gateway saw this version on sale (in any segment): it is never
--         created here again, whatever Redis holds (emptied, flushed, an older snapshot)
-- ARGV[7] the newest life of the segment's records the calling gateway saw ('' none): a new
--         life starts after it (see new_life in lib.lua)
-- ARGV[8] '1': a variant's stock lane (src/stock/layout.rs): users and idem are the
--         activity's, shared with its other variants' lanes, and may exist before this lane;
--         '2': such a lane, and another variant's lane of the activity was put on sale before
--         (so users and idem must exist: gone, they are lost, never made again here); '0' or
--         '' otherwise
-- ARGV[9] when the sale opens (unix ms, Redis's clock; '' never: no hold)   ARGV[10] the birth
--         hold (ms; 0 none): a version created here, in a segment that had none on sale, at or
--         after its sale opened may be one a store that forgot it had sold (an emptied Redis, a
--         gateway with nothing in memory making it again from its YAML). In doubt, hold: it is
--         born fenced (the master record says `born`, known `born` = now) and sells only once
--         it stood the hold (every live gateway's master check, each second, has looked by then:
--         one that saw it sell finds the records made again and marks the segment lost;
--         lua/master.lua arms it after the hold). Before the sale opens nothing can have sold.
--         A stock not born on hold is accepted under the master answering now (its master
--         record set, if none): a failover before any gateway's check armed it is fenced too.
-- ARGV[11] the birth hold applies only while Redis's uptime is under this many seconds ('':
--         always). A gateway passes it when it sees no other gateway alive: a Redis that
--         restarted (empty) just now dropped every gateway's subscription, and one that saw the
--         sale may not have subscribed again yet (`StockStore::other_gateways_alive`); in doubt, hold.
-- ARGV[12..] the other versions
--
-- Returns {code, version on sale here, when it went on sale here (unix ms; '' unknown), when
-- the segment was last recounted (unix ms; '' never), '1' when it was born on hold (ARGV[10])
-- now, else ''}: the version's birth in this segment is
-- what a gateway that saw it on sale remembers (a version made again, by a gateway that did
-- not, is another birth: a loss, unless a recount made it)
--   1 created: the version is on sale here (the one before it is retired: its units left are
--     counted retired in its ledger and its stock key removed, so it can never sell again, and
--     none of its units move into the new version)
--   0 already on sale
--  -1 the version's stock key is gone (removed by hand) while the segment remembers the
--     version on sale, or keys of a version the meta does not list exist: never re-created,
--     since that would put sold units on sale again; raise the version to restock
--  -2 a newer version is on sale here (an older YAML): refused
--  -3 what is on sale changed since the caller read it: read again
--  -4 a key the segment had is gone: a placeholder, the event stream, the ledger of the
--     version on sale, or the meta while anything else remains (removed by hand, evicted or
--     lost with Redis's data): the per-user limit, the records or the versions to sweep can no
--     longer be trusted; refused, never repaired
--  -5 the segment holds less than was sold: known says so for this version or a later one
--     (master.lua), or the version would be created although the caller saw it on sale: never
--     created, until an operator's recount (recount.lua); a newer version goes on sale afresh
--     (and ends the loss: the segment's records start a new life)
--
-- Every key that exists gets its expiry moved to expire-at when that is later (never earlier),
-- so extending ends_at mid-sale never lets the stock or its ledger vanish before the rest.

local KNOWN, RECORD, OTHERS = KEYS[12], KEYS[13], 14
local SHARED, SIBLINGS, FIRST_OTHER = ARGV[8] == '1' or ARGV[8] == '2', ARGV[8] == '2', 12
-- When the segment was last recounted (every reply names it: a gateway marking the segment lost
-- from this reply marks nothing if a recount came since, see master.lua).
local recount = string.match(redis.call('HGET', KNOWN, 'recount') or '', '|(%d+)$') or ''
local current = redis.call('HGET', KEYS[1], 'current') or ''
if current ~= ARGV[2] then
  return {-3, current, '', recount}
end
local version = ARGV[1]
if current ~= '' and tonumber(version) < tonumber(current) then
  return {-2, current, '', recount}
end
local lost = redis.call('HGET', KNOWN, 'lost')
if lost and tonumber(version) <= (tonumber(string.match(lost, '^(%d+)|') or '') or math.huge) then
  return {-5, current, '', recount}
end
local has_stock = redis.call('EXISTS', KEYS[2]) == 1
local has_ledger = redis.call('EXISTS', KEYS[3]) == 1
-- What an earlier prewarm left here besides the meta: the placeholders and the event stream.
-- A variant's lane counts users and idem apart: another variant's prewarm may have made them
-- (before this lane's first prewarm); once this lane or another is on sale they must be there.
local shared_kept = not SHARED or (marked(KEYS[5]) and marked(KEYS[7]))
local own = SHARED and {KEYS[6], KEYS[9], KEYS[10], KEYS[11]}
  or {KEYS[5], KEYS[6], KEYS[7], KEYS[9], KEYS[10], KEYS[11]}
local marks, expected = 0, 0
for _, key in ipairs(own) do
  expected = expected + 1
  if marked(key) then
    marks = marks + 1
  end
end
expected = expected + 1
if redis.call('EXISTS', KEYS[8]) == 1 then
  marks = marks + 1
end
local pending_marked = redis.call('ZSCORE', KEYS[4], '') ~= false
if current == '' then
  -- No meta. A segment with nothing in it is new; one that has anything prewarm writes lost
  -- its meta, the only list of the versions it had (their pending reservations, the version to
  -- retire): never adopted, never created over.
  if marks > 0 or pending_marked or has_stock or has_ledger or ARGV[5] == '1'
      or (SIBLINGS and not shared_kept) then
    return {-4, '', '', recount}
  end
elseif marks < expected or not shared_kept or (current == version and not pending_marked)
    or (current == version and has_stock and not has_ledger) then
  return {-4, current, '', recount}
end
local code = 0
local held = ''
if current == version then
  if not has_stock then
    code = -1
  end
elseif has_stock or has_ledger then
  -- The version's keys exist but the meta does not list it as on sale: never create over them.
  code = -1
elseif ARGV[6] == '1' then
  -- Seen on sale and gone: what was sold is forgotten, never sold again from the YAML (and
  -- the version on sale here, if any, is left as it is).
  return {-5, current, '', recount}
else
  if current ~= '' then
    local found = false
    for i = FIRST_OTHER, #ARGV do
      found = found or ARGV[i] == current
    end
    if not found then
      return redis.error_reply('prewarm: the keys of version ' .. current .. ' were not passed')
    end
    for i = FIRST_OTHER, #ARGV do
      if ARGV[i] == current then
        local stock = KEYS[OTHERS + (i - FIRST_OTHER) * 3]
        local ledger = KEYS[OTHERS + 1 + (i - FIRST_OTHER) * 3]
        local left = tonumber(redis.call('GET', stock) or '0')
        if left > 0 and redis.call('EXISTS', ledger) == 1 then
          redis.call('HINCRBY', ledger, 'retired', left)
          redis.call('HINCRBY', ledger, 'unsold_retired', left)
        end
        redis.call('DEL', stock)
      end
    end
  end
  if lost then
    -- A newer version over a loss: it sells afresh, in a new life of the segment's records
    -- (the counts gateways saw before say nothing of it), and the loss's mark on the master
    -- record goes (a replaced master still fences as before).
    redis.call('HDEL', KNOWN, 'lost', 'hw')
    local life = new_life(newer_of(ARGV[7], redis.call('HGET', KEYS[6], '') or ''))
    redis.call('HSET', KEYS[6], '', life)
    redis.call('HSET', KNOWN, 'life', life)
    if redis.call('GET', RECORD) == 'lost' then
      redis.call('DEL', RECORD)
    end
  end
  redis.call('SET', KEYS[2], ARGV[3])
  local ledger = {}
  for _, field in ipairs(LEDGER_FIELDS) do
    ledger[#ledger + 1] = field
    ledger[#ledger + 1] = field == 'initial' and ARGV[3] or '0'
  end
  redis.call('HSET', KEYS[3], unpack(ledger))
  local born_on = current == '' and ARGV[9] ~= '' and tonumber(ARGV[10]) > 0
    and (ARGV[11] == '' or tonumber(string.match(redis.call('INFO', 'server'),
      'uptime_in_seconds:(%d+)') or '0') < tonumber(ARGV[11]))
  local now = now_ms()
  redis.call('HSET', KEYS[1], 'current', version, 'v:' .. version, int(now))
  if born_on and now >= tonumber(ARGV[9]) then
    -- Born fenced (see ARGV[10]); its expiry is moved with every other key's below.
    redis.call('SET', RECORD, 'born')
    redis.call('HSET', KNOWN, 'born', int(now))
    held = '1'
  elseif redis.call('EXISTS', RECORD) == 0 then
    -- Accepted under the master answering now, from its first unit: a failover before any
    -- gateway's check armed it (master.lua, within a second) is fenced all the same.
    redis.call('SET', RECORD, replid_in(redis.call('INFO', 'replication')))
    -- And the process it is (master.lua's same_process rule: the replication id a first
    -- replica's sync gives this very process lifts the fence by itself).
    local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
    if run then
      redis.call('HSET', KNOWN, 'run', run)
    end
  end
  code = 1
end
-- Placeholders keep keys in existence (an empty hash or set is removed), so that the scripts that
-- write them on the buyer's path never create a key without an expiry.
redis.call('ZADD', KEYS[4], 'NX', '+inf', '')
for _, key in ipairs({KEYS[5], KEYS[7], KEYS[9], KEYS[10], KEYS[11]}) do
  redis.call('HSETNX', key, '', '')
end
-- The records' placeholder names their life (see records_of in lib.lua).
if redis.call('HEXISTS', KEYS[6], '') == 0 then
  redis.call('HSET', KEYS[6], '', new_life(ARGV[7]))
end
if redis.call('EXISTS', KEYS[8]) == 0 then
  redis.call('XADD', KEYS[8], 'MAXLEN', '0', '*', 'type', 'init')
end
for _, key in ipairs(KEYS) do
  extend(key, ARGV[4])
end
return {code, version, redis.call('HGET', KEYS[1], 'v:' .. version) or '', recount, held}
