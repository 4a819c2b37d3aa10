-- flashgate reserve: take units of one segment's stock for a batch of buyers, atomically, and
-- record each reservation (ledger, hold deadline, event) in the same step. (lib.lua is prepended.)
-- The items are judged one after another exactly as separate calls in that order would be (each
-- sees what the ones before it took: stock, per-user units, ids, idempotency keys, the ledger),
-- with one TIME for the batch (read when the first item needs it: as if they all arrived then).
-- A batch of one is the single reserve.
--
-- Writes are gathered: every item's record, pending entry and idempotency key, every buyer's
-- units, the stock, the ledger's counts, a deposit's transfer book and the batch's event are
-- written once per batch, after the last item is judged. Measured: Redis charges about 1.5 us
-- per write command a script makes on top of the command itself, and a reservation needs six;
-- gathered, a batch makes a fixed handful whatever its size. The batch's new reservations are
-- one event: one stream entry, `type reserve`, whose `jti`, `user` and `qty` are the items'
-- joined by a line break (a user id never holds one, src/admission/identity.rs; a batch of one is
-- the entry a single reservation always was), in the order they were judged, with the batch's
-- `ver` and `ts` (callgrind: an XADD an item was 17,000 instructions a reservation at batches of
-- 4).
--
-- The batch lands whole or not at all. Nothing is written while the items are judged, so an
-- error there (a hand-edited value that is no number) leaves nothing. Then the event is the
-- first write (a stream made unwritable by hand, at its last possible id, fails the call there,
-- before anything else), and nothing after it can fail: every other key written is of its type
-- before anything is written (a key of another type, set by hand, refuses the batch as a damaged
-- segment, -6, with nothing changed), the stock is an integer (else damaged too), and Redis
-- refuses a script for memory only at its first write. The types are known without a TYPE call
-- each where a call the batch needs anyway tells (five TYPE calls were 27,000
-- instructions a call): users, res and stock by the reads below (a read of a key of another
-- type fails the call before any write), idem by its placeholder's HEXISTS (answered, not
-- raised), the ledger, the events and pending by one TYPE each (the first two also say whether
-- they exist), received only when an item deposits (the only batch that writes it). Not held:
-- a ledger count edited by hand into no integer fails its HINCRBY midway (as it always did).
--
-- KEYS[1] stock of the version   KEYS[2] users (units held, all versions)   KEYS[3] res (records)
-- KEYS[4] ledger of the version  KEYS[5] pending of the version (jti -> when due)
-- KEYS[6] idem (user "\n" Idempotency-Key -> jti)   KEYS[7] events   KEYS[8] received transfers
-- KEYS[9] the segment's master record (the failover fence, see master_holds in lib.lua)
-- KEYS[10] known (what the gateways know the segment must hold, see master.lua): read only when
-- the records' life is newer than the one the gateway saw (renewed_unseen in lib.lua)
-- KEYS[11] line, KEYS[12] its holds (only for a lane with a second-chance line, see
-- lua/line.lua): while anyone waits in the line, only a buyer holding a unit for it (a hold not
-- run out, for one unit) may take one, and leaves the line; everyone else is told -15
-- ARGV[1] version   ARGV[2] stream cap   ARGV[3] the master identity the gateway last saw
-- accepted here ('' if none)   ARGV[4] the most reservation records the gateway saw the segment
-- hold when it acknowledged a sale here ('0' none), ARGV[5] of which life (see records_of in
-- lib.lua), ARGV[6] the newest version of a sale the gateway acknowledged in that life ('0'
-- none): together, the gateway's fencing token (what it knows of the store's life); then 13 per
-- item, item i's a[j] = ARGV[6 + 13(i-1) + j]:
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
-- a[13] the buyer's phases ('' for an activity without phases): "start limit phase" triples,
--      space-separated, by start (unix ms): from each start on (Redis's clock) the buyer may
--      hold that many units (instead of a[3]) and buys in that phase; before the first, -9.
--      The units taken are counted in the ledger's `sold@<phase>` (gross: a unit given back
--      stays counted where it was taken). Triples one space apart, as the gateway writes them
--      (src/stock/steps.rs); a string not in that form admits nobody (-9).
--
-- Returns one reply per item, in order; an item's reply (times in ms, Redis's clock; fence: the record's fence once this request's forward is
-- counted, which an early order lookup it asks for must name, see lib.lua):
--   {1, remaining, held, created, deadline, fence}   reserved
--   {2, remaining, qty, jti, ver, created, deadline, fence, phase}   idempotent replay: the
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
--  {-6, 0, 0}                        the segment lost a key it had (users, res, idem, or the
--                                    ledger of a version whose stock is there): refused
--  {-7, code, 0}                     the transfer to deposit first could not land (deposit's
--                                    code: -1 no ledger of its version, -2 received book lost);
--                                    nothing changed, the transfer stays in flight
--  {-8, 0, 0}                        replay only, and the key won nothing: nothing changed
--  {-9, 0, 0}                        the sale has not opened yet (Redis's clock): nothing changed
-- {-10, 0, 0}                        the sale has closed (Redis's clock): nothing changed
-- {-11, qty, 0}                      the key's reservation is for another quantity (qty): this
--                                    request is not its retry; nothing changed
-- {-13, 0, 0}                        fenced: this master is not the one the segment's stock was
--                                    accepted under (a replica promoted, a restart under a new
--                                    replication id), or the segment holds fewer records than
--                                    the gateway saw it hold (the store went back: an older
--                                    snapshot, an emptied Redis), or its records are of a
--                                    newer life the gateway did not see begin and no recount
--                                    or newer version started (the store was emptied and its
--                                    stock made again: marked lost here, for every gateway, when
--                                    the gateway sold this version in the life it saw): nothing
--                                    else changed, every item
-- {-14, 0, 0}                        the key's reservation is another variant's (its id names
--                                    another lane, see lane_of): this request is not its retry;
--                                    nothing changed
-- {-15, remaining, held}             the lane's units are its second-chance line's: this buyer
--                                    holds none of them (not in the line, not at its head yet,
--                                    or their hold ran out): nothing changed
-- {-12, ver, 0}                      the key's reservation is pending under another version
--                                    (ver), whose pending set is not in KEYS: ask again, replay
--                                    only, with that version's keys; nothing changed
-- After the items' replies, two more: the records the segment holds once the batch is written
-- (0 when it holds none), and their life: res only ever grows within a life, so a store that
-- later holds fewer forgot what this gateway acknowledged (see records_of in lib.lua).
--
-- O(items): a loop over the batch (at most 32 items, the gateway's bound), O(1) per item; every
-- key in KEYS, all keys share the segment's hash tag.
-- Numbers are compared with tonumber: as strings "10" < "9".

local A, VER, MAXLEN = ARGV, ARGV[1], ARGV[2]
local ITEM_ARGS, FIRST_ITEM = 13, 6
local STOCK, USERS, RES, LEDGER, PENDING, IDEM, EVENTS, RECEIVED =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local LINE, HOLDS = KEYS[11], KEYS[12]

-- The failover fence, and whether the store went back or was made again, before anything is
-- read or written.
local records, life = records_of(RES)
-- A version this gateway sold in the life it saw, made again in another: the store forgot what
-- it sold. (A newer version than the gateway sold there is another sale: taken; a version whose
-- stock is gone is not on sale here, and is answered as such below.)
local renewed = false
if tonumber(VER) <= tonumber(ARGV[6]) and renewed_unseen(life, ARGV[5], KEYS[10]) then
  local at = redis.call('EXPIRETIME', STOCK)
  renewed = at ~= -2
  -- Marked lost as the master check would (lua/master.lua), so that every gateway's next
  -- reserve here is refused too (the one that made it again included), with the expiry
  -- prewarm gave the stock (a stock without one is left to the master check).
  if at > 0 then
    redis.call('SET', KEYS[9], 'lost', 'EXAT', at)
    redis.call('HSETNX', KEYS[10], 'lost', VER .. '|keys_lost|' .. int(records) .. '|'
      .. ARGV[4] .. '|' .. int(now_ms()))
    extend(KEYS[10], at)
  end
end
if renewed or not master_holds(KEYS[9], ARGV[3])
    or went_back(records, life, tonumber(ARGV[4]), ARGV[5]) then
  local fenced = {}
  for _ = FIRST_ITEM, #ARGV - ITEM_ARGS, ITEM_ARGS do
    fenced[#fenced + 1] = {-13, 0, 0}
  end
  fenced[#fenced + 1] = 0
  fenced[#fenced + 1] = ''
  return fenced
end

local function type_of(key)
  return redis.call('TYPE', key).ok
end
local function of_type(key, want)
  local t = type_of(key)
  return t == 'none' or t == want
end
-- marked() of lib.lua, answering false for a key of another type instead of failing the call.
local function marked_hash(hash)
  local r = redis.pcall('HEXISTS', hash, '')
  return r == 1
end

-- Whether an item deposits a transfer first (the only batch that writes received).
local deposits = false
for base = FIRST_ITEM, #ARGV - ITEM_ARGS, ITEM_ARGS do
  if A[base + 7] ~= '' then
    deposits = true
    break
  end
end

-- The batch's view of what it read and what it will write.
local prewarmed = records > 0 and marked(USERS)
local ledger_type = prewarmed and type_of(LEDGER)
local events_type = prewarmed and type_of(EVENTS)
-- The idempotency keys must still be there (a lost idem hash would sell a key's purchase twice).
local whole = prewarmed and (ledger_type == 'none' or ledger_type == 'hash')
  and (events_type == 'none' or events_type == 'stream') and marked_hash(IDEM)
  and of_type(PENDING, 'zset') and (not deposits or of_type(RECEIVED, 'hash'))
  and (not LINE or (of_type(LINE, 'zset') and of_type(HOLDS, 'hash')))
local left = prewarmed and redis.call('GET', STOCK)
local stock_exists = left ~= nil and left ~= false
-- A stock INCRBY would refuse ("7.0", "0x7": numbers to Lua) is a damaged segment.
whole = whole and (not stock_exists or string.match(left, '^-?%d+$') ~= nil)
-- The version's stock without its ledger (deleted, or lost): damaged too, so the counts below
-- never make the ledger again without its `initial` (a drift no resume could mend); the
-- prewarm marks the segment lost and an operator's recount makes the ledger again.
whole = whole and (not stock_exists or ledger_type == 'hash')
left = tonumber(left or '0')
local ledger_exists = ledger_type == 'hash'
local events_exist = events_type == 'stream'
local stock_delta, pending_units = 0, 0
local held, held_dirty = {}, {}
local recs, rec_dirty, rec_new, due_new, due_moved = {}, {}, {}, {}, {}
local idem_new, idem_order = {}, {}
-- The batch's event: its new reservations' ids, buyers and units, in the order judged.
local ev_jti, ev_user, ev_qty = {}, {}, {}
local clock
local function now()
  if not clock then
    clock = now_ms()
  end
  return clock
end

local function held_by(user)
  local h = held[user]
  if h == nil then
    h = tonumber(redis.call('HGET', USERS, user) or '0')
    held[user] = h
  end
  return h
end

-- Numbers the items pass as strings, converted once per distinct string (a batch's items
-- mostly share their limit, hold, trip and hours), and integers formatted once per value (its
-- items share the batch's TIME): string.format and tonumber are most of an item's Lua time.
local function once_each(f)
  local seen = {}
  return function(x)
    if x ~= x then
      -- NaN (a hold or trip of 'nan'; the gateway sends integers) cannot be a table key.
      return f(x)
    end
    local y = seen[x]
    if y == nil then
      y = f(x)
      seen[x] = y
    end
    return y
  end
end
local num, fmt = once_each(tonumber), once_each(int)

-- The limit and the phase in force for a buyer's phases (a[13]) at the batch's clock, or false
-- before the first: worked out once per distinct string a batch (its buyers mostly share theirs,
-- and its items share one TIME, so the answer is the same for each), the last one asked kept at
-- hand. A sale without phases makes neither the table nor the parse.
local phase_now, last_steps, last_phase = nil, '', false
local function phase_of(steps)
  local p = phase_now and phase_now[steps]
  if p == nil then
    local t, at = now(), 1
    p = false
    while true do
      local _, stop, start, limit, id = string.find(steps, '^(%d+) (%d+) ([%w_-]+) ?', at)
      if not stop then
        -- Steps not in the gateway's form ("start limit id", one space between): none holds.
        if at <= #steps then
          p = false
        end
        break
      end
      if tonumber(start) > t then
        break
      end
      p, at = {tonumber(limit), id}, stop + 1
    end
    phase_now = phase_now or {}
    phase_now[steps] = p
  end
  last_steps, last_phase = steps, p
  return p
end
-- The units this batch sold per phase (the ledger's `sold@<phase>`, counted once a batch).
local phase_sold

-- The second-chance line (a lane whose KEYS hold it; none: nothing of it is made): buyers
-- waiting in it (read when an item first needs it), and the holders this batch sold to (they
-- leave the line with the batch's writes).
local line_lets
local line_waiting, line_sold, line_sold_units
if LINE then
  line_sold, line_sold_units = {}, 0
  -- Whether the line lets this buyer take `qty` now: no one waits, or they hold a unit for it.
  line_lets = function(user, qty)
    if line_waiting == nil then
      line_waiting = redis.call('ZCARD', LINE)
    end
    if line_waiting == 0 then
      return true, false
    end
    if line_sold[user] or qty ~= 1 then
      return false, false
    end
    local until_ms = tonumber(redis.call('HGET', HOLDS, user) or '')
    return until_ms ~= nil and until_ms > now(), true
  end
end

-- A record as this batch sees it (read once, then kept), or nil.
local function record(jti)
  local rec = recs[jti]
  if rec == nil then
    rec = decode(redis.call('HGET', RES, jti)) or false
    recs[jti] = rec
  end
  return rec or nil
end

-- Whether a record exists under jti (read ahead for the batch's ids, see below).
local present = {}
local function exists(jti)
  if recs[jti] then
    return true
  end
  local p = present[jti]
  if p == nil then
    p = redis.call('HEXISTS', RES, jti) == 1
    present[jti] = p
  end
  return p
end

local function idem_of(field)
  return idem_new[field] or redis.call('HGET', IDEM, field)
end

-- The stock lane (a drop's variant) a reservation id names: between its two '~'
-- (<uuid>~<variant>~<segment>: a variant id may hold dots), or in an older flashgate's id
-- (<uuid>~<variant>[.<segment>]) what follows its '~' up to a '.'; '' for an activity without
-- variants. The lanes of one activity share its buyers' units and idempotency keys (see
-- src/stock/layout.rs), not their records.
local function lane_of(jti)
  return string.match(jti, '~(.*)~%d+$') or string.match(jti, '~([^.]*)') or ''
end

-- deposit() of lib.lua, with the batch's view of the stock and the ledger.
-- Its writes are gathered with the batch's (received_new, ledger_add).
local received_new, ledger_add, ledger_fields = {}, {}, {}
local function ledger_count(field, n)
  if not ledger_add[field] then
    ledger_add[field] = 0
    ledger_fields[#ledger_fields + 1] = field
  end
  ledger_add[field] = ledger_add[field] + n
end
local function deposit_here(id, qty)
  if not marked(RECEIVED) then
    return -2
  end
  if received_new[id] or redis.call('HEXISTS', RECEIVED, id) == 1 then
    return 0
  end
  if not ledger_exists then
    return -1
  end
  received_new[#received_new + 1] = id
  received_new[id] = qty
  ledger_count('moved_in', tonumber(qty))
  if stock_exists then
    left = left + tonumber(qty)
    stock_delta = stock_delta + tonumber(qty)
  else
    ledger_count('retired', tonumber(qty))
    ledger_count('unsold_retired', tonumber(qty))
  end
  return 1
end

-- The key's reservation, answered again; nil if it has none that is not released.
local function replay(b, field)
  local previous = idem_of(field)
  if previous and lane_of(previous) ~= lane_of(A[b + 4]) then
    return {-14, 0, 0}
  end
  local rec = previous and record(previous)
  if not rec or rec.state == 'released' then
    return nil
  end
  if rec.state == 'pending' and tonumber(rec.deadline) <= now() then
    return {-5, 0, 0}
  end
  if rec.qty ~= A[b + 2] then
    -- A retry asking for another quantity is not the same purchase: never forwarded with the
    -- first one's claims.
    return {-11, tonumber(rec.qty), 0}
  end
  if rec.state == 'pending' and rec.ver ~= VER then
    -- Its due time lives in its own version's pending set: moved there, or not at all.
    return {-12, tonumber(rec.ver), 0}
  end
  if not flagged(rec, 'r') then
    rec.flags = rec.flags .. 'r'
    rec_dirty[previous] = true
  end
  if rec.state == 'pending' then
    -- Forwarded again: the fence moves (a lookup answer asked before this is discarded), and
    -- it is not due while this request may still be at the backend.
    forwarded(rec, now(), num(A[b + 9]))
    rec_dirty[previous] = true
    if not rec_new[previous] then
      due_moved[previous] = rec.busy
    end
  end
  return {2, stock_exists and left or -1, tonumber(rec.qty), previous, rec.ver, rec.created,
    rec.deadline, rec.fence, rec.phase}
end

local function reserve(b)
  if not prewarmed then
    -- Never prewarmed here (no stock key either), or damaged.
    if redis.call('EXISTS', STOCK) == 0 then
      return {-1, 0, 0}
    end
    return {-6, 0, 0}
  end
  if not whole then
    return {-6, 0, 0}
  end
  if A[b + 7] ~= '' then
    local landed = deposit_here(A[b + 7], A[b + 8])
    if landed < 0 then
      return {-7, landed, 0}
    end
  end
  if A[b + 6] ~= '' then
    local replayed = replay(b, A[b + 6])
    if replayed then
      return replayed
    end
  end
  if A[b + 10] == '1' then
    return {-8, 0, 0}
  end
  if not stock_exists then
    return {-1, 0, 0}
  end
  local qty = num(A[b + 2])
  local h = held_by(A[b + 1])
  local limit, phase = num(A[b + 3]), nil
  local steps = A[b + 13]
  if steps ~= '' then
    -- The buyer's phase by Redis's clock decides their limit (and whether they may buy yet).
    local p = last_phase
    if steps ~= last_steps then
      p = phase_of(steps)
    end
    if not p then
      return {-9, 0, 0}
    end
    limit, phase = p[1], p[2]
  end
  local holder = false
  if line_lets then
    local lets
    lets, holder = line_lets(A[b + 1], qty)
    if not lets then
      return {-15, left, h}
    end
  end
  if h + qty > limit then
    return {-3, left, h}
  end
  if left < qty then
    return {-2, left, h}
  end
  -- A replay above still answers what the key won; nothing new is taken outside the sale's
  -- hours (checked last: refusals above cost no TIME call). A transfer deposited above stays: it
  -- only moved units between segments of one version.
  local t = now()
  if t < num(A[b + 11]) then
    return {-9, 0, 0}
  end
  if t >= num(A[b + 12]) then
    return {-10, 0, 0}
  end
  if exists(A[b + 4]) then
    return {-4, left, h}
  end
  -- A new record, forwarded once (forwarded() of lib.lua on a fresh record, its numbers
  -- formatted once each: string.format is most of a reservation's Lua time).
  local created = fmt(t)
  local deadline_ms, busy_ms = t + num(A[b + 5]), t + num(A[b + 9])
  local deadline = fmt(deadline_ms)
  local rec = {state = 'pending', qty = A[b + 2], ver = VER, created = created,
    deadline = deadline, done = '', reason = '', flags = phase and 'fp' or 'f', fence = '1',
    prior = '0',
    busy = fmt(busy_ms), user = A[b + 1], phase = phase}
  rec.due = deadline_ms >= busy_ms and deadline or rec.busy
  recs[A[b + 4]], rec_new[A[b + 4]], rec_dirty[A[b + 4]] = rec, true, true
  due_new[#due_new + 1] = A[b + 4]
  left = left - qty
  stock_delta = stock_delta - qty
  h = h + qty
  held[A[b + 1]], held_dirty[A[b + 1]] = h, true
  pending_units = pending_units + qty
  -- The ledger exists (a stock without it is damaged, above): a deposit after this item sees
  -- it, as a separate call's would.
  ledger_exists = true
  if A[b + 6] ~= '' then
    if not idem_new[A[b + 6]] then
      idem_order[#idem_order + 1] = A[b + 6]
    end
    idem_new[A[b + 6]] = A[b + 4]
  end
  ev_jti[#ev_jti + 1], ev_user[#ev_user + 1], ev_qty[#ev_qty + 1] = A[b + 4], A[b + 1], A[b + 2]
  if phase then
    phase_sold = phase_sold or {}
    phase_sold[phase] = (phase_sold[phase] or 0) + qty
  end
  if holder then
    line_sold[#line_sold + 1] = A[b + 1]
    line_sold[A[b + 1]] = true
    line_waiting = line_waiting - 1
    line_sold_units = line_sold_units + qty
  end
  -- Times and fence as numbers: integer replies, which the gateway reads without a string.
  return {1, left, h, t, deadline_ms, 1}
end

-- Read ahead, in one call each, what the items will ask: the units each buyer holds, and
-- whether each new id is taken (a read, whatever the items then come to). A batch of one
-- asks as it goes (two calls either way), as does one past the gateway's bound (unpack takes
-- a few thousand values at most).
local items = (#ARGV - FIRST_ITEM) / ITEM_ARGS
if prewarmed and whole and stock_exists and items >= 2 and items <= 64 then
  local users, ids = {}, {}
  for base = FIRST_ITEM, #ARGV - ITEM_ARGS, ITEM_ARGS do
    if A[base + 10] ~= '1' then
      users[#users + 1] = A[base + 1]
      ids[#ids + 1] = A[base + 4]
    end
  end
  if #users > 0 then
    local units = redis.call('HMGET', USERS, unpack(users))
    local taken = redis.call('HMGET', RES, unpack(ids))
    for i = 1, #users do
      held[users[i]] = tonumber(units[i] or '0')
      present[ids[i]] = taken[i] ~= false
    end
  end
end

local replies = {}
for base = FIRST_ITEM, #ARGV - ITEM_ARGS, ITEM_ARGS do
  replies[#replies + 1] = reserve(base)
end

-- The gathered writes (see the top).
local function hset(key, fields)
  if #fields > 0 then
    redis.call('HSET', key, unpack(fields))
  end
end
-- The first write: the batch's event (see the top).
if events_exist and #ev_jti > 0 then
  emit_batch(EVENTS, MAXLEN, 'reserve', ev_jti, ev_user, ev_qty, 'ver', VER, 'ts', fmt(clock))
end
local fields = {}
for _, jti in ipairs(due_new) do
  -- Due at its deadline, or when its forward's trip surely ends if later (a replay in this
  -- batch may have moved that).
  local rec = recs[jti]
  local due = rec.due
  if rec.fence ~= '1' and tonumber(rec.busy) > tonumber(due) then
    due = rec.busy
  end
  fields[#fields + 1] = due
  fields[#fields + 1] = jti
end
if #fields > 0 then
  redis.call('ZADD', PENDING, unpack(fields))
end
fields = {}
for jti, busy in pairs(due_moved) do
  fields[#fields + 1] = busy
  fields[#fields + 1] = jti
end
if #fields > 0 then
  redis.call('ZADD', PENDING, 'XX', 'GT', unpack(fields))
end
fields = {}
for _, id in ipairs(received_new) do
  fields[#fields + 1] = id
  fields[#fields + 1] = received_new[id]
end
if #fields > 0 then
  redis.call('HSET', RECEIVED, unpack(fields))
end
for _, field in ipairs(ledger_fields) do
  redis.call('HINCRBY', LEDGER, field, ledger_add[field])
end
-- Before the stock and the records: a count edited by hand into no integer fails the batch here,
-- with only its event written (as the ledger's other counts do).
if phase_sold then
  for phase, units in pairs(phase_sold) do
    redis.call('HINCRBY', LEDGER, 'sold@' .. phase, units)
  end
end
if stock_delta ~= 0 then
  redis.call('INCRBY', STOCK, stock_delta)
end
-- The batch that took the last unit records when (the ledger's sold_out_ms, for `flashgate
-- report`; a later one after units came back writes it again): one write a sell-out.
if stock_delta < 0 and left == 0 then
  redis.call('HSET', LEDGER, 'sold_out_ms', int(clock))
end
fields = {}
for user in pairs(held_dirty) do
  fields[#fields + 1] = user
  fields[#fields + 1] = int(held[user])
end
hset(USERS, fields)
fields = {}
for jti in pairs(rec_dirty) do
  fields[#fields + 1] = jti
  fields[#fields + 1] = encode(recs[jti])
end
hset(RES, fields)
if pending_units > 0 then
  redis.call('HINCRBY', LEDGER, 'pending', pending_units)
end
fields = {}
for _, field in ipairs(idem_order) do
  fields[#fields + 1] = field
  fields[#fields + 1] = idem_new[field]
end
hset(IDEM, fields)
-- The line's buyers who bought leave it (and their holds); the units it sold are counted.
if line_sold and #line_sold > 0 then
  redis.call('ZREM', LINE, unpack(line_sold))
  redis.call('HDEL', HOLDS, unpack(line_sold))
  redis.call('HINCRBY', LEDGER, 'line_sold', line_sold_units)
end
replies[#replies + 1] = records > 0 and records + #due_new or 0
replies[#replies + 1] = life
return replies
