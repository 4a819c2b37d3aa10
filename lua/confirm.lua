-- flashgate confirm: pending reservations of one version become confirmed (the order exists),
-- each exactly once; up to a batch per call. (lib.lua is prepended.)
--
-- KEYS[1] res   KEYS[2] ledger of the version   KEYS[3] pending of the version   KEYS[4] events
-- KEYS[5] stock of the version   KEYS[6] users
-- ARGV[1] version   ARGV[2] via (upstream, admin, lookup)   ARGV[3] stream cap
-- ARGV[4..] reservation ids (the caller sends at most a bounded batch)
--
-- A reservation the backend itself says it took (via upstream: a 2xx to the forward; via
-- lookup: the order lookup found it) that the gateway had released (expired, the lookup's "not
-- found", a failed forward: any reason but admin) is a late acceptance: the backend holds an
-- order whose units the gateway gave back. It is a fact of the sale, recorded once per
-- reservation (flag l): the version's ledger counts late_accepted, and the units are covered if
-- nobody else can have them: from the version's stock while it is on sale here and has them;
-- from its retired units once it is retired (units retired at the release, flag x, were never
-- sold again; units returned to stock and then retired are covered while unsold_retired has
-- them). A cover is a confirmed record `<uuid>-late[.<n>]` for the same user, counted in confirmed
-- and the user's units. Otherwise the units are counted oversold. A reservation an admin call
-- released (the backend or an operator cancelled it) is not counted: an acceptance reported for
-- it came before the cancel. An admin confirm of a released reservation is refused (-3).
--
-- Returns one code per id: 1 confirmed, 0 already confirmed, -1 unknown, -2 version mismatch,
-- -3 released (too late: the units went back), -4 released, accepted late and covered from
-- stock or retired units, -5 released, accepted late and oversold (nothing left to cover it).

--
-- O(ids). Per batch, not per id: the records are read in one HMGET and the confirmed ones
-- written in one HSET, the ledger moved by one HINCRBY per field, the pending entries removed by
-- one ZREM, and the batch's events appended after its writes, in the order of its ids. An id met
-- twice in a batch (or a cover id made earlier in it) is judged by what the batch did. The
-- writes come in the order one confirm always made them (record, ledger, pending set, event),
-- so a key damaged by hand that fails the call midway leaves what it left before: a record
-- confirmed, never one still pending out of the pending set (the sweep would never end it). An
-- events key that is no stream fails the call before any write. A late acceptance (rare) still
-- writes as it goes.

local now = int(now_ms())
local has_ledger = redis.call('EXISTS', KEYS[2]) == 1
local via = ARGV[2]
local events_type = redis.call('TYPE', KEYS[4]).ok
if events_type ~= 'stream' and events_type ~= 'none' then
  return redis.error_reply('WRONGTYPE the events key ' .. KEYS[4] .. ' is a ' .. events_type)
end
local events_exist = events_type == 'stream'
-- The batch's view of its records (an id met again is judged by what was done to it: false if
-- unknown) and its events, appended once its writes are done.
-- An event is a confirmed id (its record in `seen` says the rest) or a late acceptance's
-- arguments.
local seen, events = {}, {}
local function event(e)
  if events_exist then
    events[#events + 1] = e
  end
end

-- The backend took a released reservation: counted once, covered if nobody else can have it.
local function accepted_late(jti, rec)
  local qty = tonumber(rec.qty)
  rec.flags = rec.flags .. 'l'
  if has_ledger then
    redis.call('HINCRBY', KEYS[2], 'late_accepted', qty)
  end
  local stock = redis.call('GET', KEYS[5])
  local source
  if stock then
    source = tonumber(stock) >= qty and 'stock'
  elseif not flagged(rec, 'k') then
    source = 'retired'
  elseif has_ledger and tonumber(redis.call('HGET', KEYS[2], 'unsold_retired') or '0') >= qty then
    source = 'unsold'
  end
  local base, segment = string.match(jti, '^(.*)(%.%d+)$')
  local cover = base and (base .. '-late' .. segment) or (jti .. '-late')
  local record = encode({state = 'confirmed', qty = rec.qty, ver = rec.ver, created = now,
    deadline = '', done = now, reason = 'late_accepted', flags = '', fence = '0', prior = '0',
    busy = '0', user = rec.user})
  if source and redis.call('HSETNX', KEYS[1], cover, record) == 1 then
    seen[cover] = decode(record)
    if source == 'stock' then
      redis.call('DECRBY', KEYS[5], qty)
    elseif has_ledger then
      redis.call('HINCRBY', KEYS[2], 'retired', -qty)
      if source == 'unsold' then
        redis.call('HINCRBY', KEYS[2], 'unsold_retired', -qty)
      else
        -- Its own retired units: no longer retired, sold (to the cover).
        rec.flags = string.gsub(rec.flags, 'x', '')
      end
    end
    if marked(KEYS[6]) then
      redis.call('HINCRBY', KEYS[6], rec.user, qty)
    end
    if has_ledger then
      redis.call('HINCRBY', KEYS[2], 'confirmed', qty)
    end
    redis.call('HSET', KEYS[1], jti, encode(rec))
    event({'type', 'late_accept', 'jti', jti, 'user', rec.user, 'qty', rec.qty, 'ver', rec.ver,
      'via', via, 'covered_by', cover, 'ts', now})
    return -4
  end
  redis.call('HSET', KEYS[1], jti, encode(rec))
  if has_ledger then
    redis.call('HINCRBY', KEYS[2], 'oversold', qty)
  end
  event({'type', 'late_accept', 'jti', jti, 'user', rec.user, 'qty', rec.qty, 'ver', rec.ver,
    'via', via, 'covered_by', '', 'ts', now})
  return -5
end

local FIRST = 4
local ids = {}
for i = FIRST, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
local out = {}
if #ids == 0 then
  return out
end
-- Calls `cmd key` with the list's items as arguments: in one call, or in slices past what
-- unpack takes (Lua's C stack; the gateway's batches are far below one slice). The replies,
-- concatenated.
local SLICE = 4000
local function sliced(cmd, key, list)
  if #list <= SLICE then
    return redis.call(cmd, key, unpack(list))
  end
  local replies = {}
  for first = 1, #list, SLICE do
    local reply = redis.call(cmd, key, unpack(list, first, math.min(first + SLICE - 1, #list)))
    if type(reply) == 'table' then
      for _, r in ipairs(reply) do
        replies[#replies + 1] = r
      end
    end
  end
  return replies
end

local raw = sliced('HMGET', KEYS[1], ids)
-- The confirmed records to write at the end, in order.
local written, confirmed_ids = {}, {}
-- Units confirmed, and the part of them held in doubt (flag d: no longer, see lib.lua).
local confirmed_units, doubt_units = 0, 0
for i, jti in ipairs(ids) do
  local rec = seen[jti]
  if rec == nil then
    rec = decode(raw[i]) or false
    seen[jti] = rec
  end
  local code
  if not rec then
    code = -1
  elseif rec.ver ~= ARGV[1] then
    code = -2
  elseif rec.state == 'confirmed' then
    code = 0
  elseif rec.state == 'released' then
    code = -3
    if via ~= 'admin' and rec.reason ~= 'admin' and not flagged(rec, 't')
        and not flagged(rec, 'l') then
      code = accepted_late(jti, rec)
    end
  else
    rec.state = 'confirmed'
    rec.done = now
    written[#written + 1] = jti
    written[#written + 1] = encode(rec)
    confirmed_ids[#confirmed_ids + 1] = jti
    confirmed_units = confirmed_units + tonumber(rec.qty)
    if flagged(rec, 'd') then
      doubt_units = doubt_units + tonumber(rec.qty)
    end
    event(jti)
    code = 1
  end
  out[#out + 1] = code
end
if #confirmed_ids > 0 then
  sliced('HSET', KEYS[1], written)
  if has_ledger then
    redis.call('HINCRBY', KEYS[2], 'pending', int(-confirmed_units))
    redis.call('HINCRBY', KEYS[2], 'confirmed', int(confirmed_units))
    if doubt_units > 0 then
      redis.call('HINCRBY', KEYS[2], 'held_in_doubt', int(-doubt_units))
    end
  end
  sliced('ZREM', KEYS[3], confirmed_ids)
end
-- Confirms in a row are one entry (`jti`, `user` and `qty` joined by a line break, as reserve's;
-- their `ver` is the call's: another version's id is refused, -2), a late acceptance one of its
-- own between them: the entries keep the order of the ids (an XADD an id).
local run_jti, run_user, run_qty = {}, {}, {}
local function flush()
  emit_batch(KEYS[4], ARGV[3], 'confirm', run_jti, run_user, run_qty, 'ver', ARGV[1],
    'via', via, 'ts', now)
  run_jti, run_user, run_qty = {}, {}, {}
end
for _, e in ipairs(events) do
  if type(e) == 'string' then
    local n = #run_jti + 1
    run_jti[n], run_user[n], run_qty[n] = e, seen[e].user, seen[e].qty
  else
    flush()
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', unpack(e))
  end
end
flush()
return out
