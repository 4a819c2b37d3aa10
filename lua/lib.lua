-- flashgate shared Lua, prepended to every script when it is loaded.
--
-- Keys of one segment of an activity share its hash tag {<id>} (or {<id>~<n>} when the stock is
-- split over n segments); every key a script touches is passed in KEYS.
--
-- Numbers stay exact: they travel as decimal strings (ARGV, records, replies) and are turned
-- into Lua numbers only for arithmetic on values far below 2^53 (units, milliseconds); versions
-- and stock are bounded below 2^53 by the configuration. No cjson anywhere: it writes numbers
-- with 14 significant digits.
--
-- Time comes from Redis (TIME), never from a gateway: hold deadlines, sweeps and timestamps agree
-- whatever the gateways' clocks say.
--
-- A reservation record (field <jti> of the segment's res hash) is one string:
--   state|qty|ver|created_ms|deadline_ms|done_ms|reason|flags|fence|prior_ms|busy_ms|user
-- state: pending, confirmed or released; done_ms: when it was confirmed or released; reason: why
-- it was released; flags, any of:
--   r  an idempotent replay handed it to a second request: the request that made it may no
--      longer give it back (only a confirm, an admin release, the order lookup or expiry end it)
--   k  released units went back to their version's stock
--   x  released units were retired (their version is no longer on sale here)
--   t  tombstone of an abandoned id that never reserved anything
--   l  the backend accepted it after it was released (counted once as late_accepted)
--   d  held in doubt: pending when a store event made what the store holds uncertain (a
--      fence or a loss an operator resumed, lua/doubt.lua); its hold's expiry never releases
--      it (only the backend's failure reported by its own request, a confirm, an admin release
--      or the order lookup's "no order" end it)
--   f  the record has the fence fields (every record written since they exist; a record an
--      older flashgate wrote has none: read as 0|0|0)
-- The fence: a release decided away from the request that owns the reservation (an order
-- lookup's "not found") acts on what was true when it was decided, so it names the fence it
-- saw and lands only if nothing moved it since. fence counts the moves: every forward (the
-- reserve's, each replay's) and every hand-out to an order lookup. busy_ms is when the latest
-- forward's trip surely ends (its longest trip, from when it left), prior_ms the latest end of
-- the forwards before it: an early lookup asked for by a forward that ended without an answer
-- is never made due before prior_ms (another forward may still be at the backend).
-- user comes last, so it may hold '|'.
--
-- Per version and segment a ledger hash counts units: initial, pending, confirmed, released,
-- retired, moved_in, moved_out, restocked, recounted, so that at every moment
--   initial + moved_in - moved_out + restocked ==
--     remaining + pending + confirmed + retired + recounted.
-- restocked counts units an operator added to the version on sale (restock.lua); recounted the
-- units an operator's count took off sale (negative: put on sale) after the store forgot what
-- it sold (recount.lua).
-- retired holds units that can never sell again: released after their version stopped being on
-- sale here, and (also counted in unsold_retired, which no reservation record accounts for) the
-- stock left when a newer version went on sale, and transfers arriving after that.
-- late_accepted counts units the backend accepted after their reservation was released (a fact
-- of a sale, never 'clean'): each was covered by taking a unit of the version's stock (a
-- confirmed cover record, counted in confirmed) or, with none left, counted oversold.
-- held_in_doubt counts the units of the version's reservations pending and held in doubt (flag
-- d): a part of pending, never a term of the balance. It moves where a reservation gets d
-- (doubt.lua, +qty) and where a flagged one stops being pending (a confirm, confirm.lua; a
-- release, give_back: -qty), and a recount that counts pending again from the records counts it
-- again too; so it always equals the sum over the records, and reading it is one HMGET field
-- (the admin view, flashgate_units_held_in_doubt), never a scan.

-- The pending score of a reservation held in doubt (flag d): never due for expiry (below the
-- placeholder's +inf, above any time). See lua/doubt.lua.
local HELD = '9007199254740991'

-- How long a tombstone written into a segment that was never prewarmed keeps its hash.
local ABANDONED_TTL_SECS = 86400

local LEDGER_FIELDS = {'initial', 'pending', 'confirmed', 'released', 'retired', 'moved_in',
  'moved_out', 'unsold_retired', 'late_accepted', 'oversold', 'restocked', 'recounted',
  'held_in_doubt'}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer-valued Lua number (below 2^53) as exact decimal digits. '%d' formats a C long
-- (Lua 5.1's LUA_INTFRM_T), 64 bits wherever Redis runs on a 64-bit system, and costs a third
-- of '%.0f' (measured in Redis 7.0: 0.33 us against 1.2 us a call; a reservation formats half
-- a dozen numbers).
local function int(n)
  return string.format('%d', n)
end

-- Moves a key's expiry to `at` (unix s) when that is later than the one it has, or when it has
-- none; a missing key is left alone. An expiry never moves earlier.
local function extend(key, at)
  local t = redis.call('EXPIRETIME', key)
  if t == -1 or (t >= 0 and t < tonumber(at)) then
    redis.call('EXPIREAT', key, at)
  end
end

local function flagged(r, flag)
  return string.find(r.flags, flag, 1, true) ~= nil
end

local function decode(raw)
  if not raw then
    return nil
  end
  local state, qty, ver, created, deadline, done, reason, flags, rest = string.match(raw,
    '^(%a+)|(%d+)|(%d+)|(%d*)|(%d*)|(%d*)|([%w_]*)|(%a*)|(.*)$')
  if not state then
    return nil
  end
  local r = {state = state, qty = qty, ver = ver, created = created, deadline = deadline,
    done = done, reason = reason, flags = flags, fence = '0', prior = '0', busy = '0', user = rest,
    phase = ''}
  if flagged(r, 'p') then
    -- The phase it was bought in (a sale in phases), between the fence fields and the user.
    r.fence, r.prior, r.busy, r.phase, r.user =
      string.match(rest, '^(%d+)|(%d+)|(%d+)|([%w_-]*)|(.*)$')
  elseif flagged(r, 'f') then
    r.fence, r.prior, r.busy, r.user = string.match(rest, '^(%d+)|(%d+)|(%d+)|(.*)$')
  end
  if flagged(r, 'f') and not r.fence then
    return nil
  end
  return r
end

local function encode(r)
  local flags = r.flags
  if not flagged(r, 'f') then
    flags = flags .. 'f'
  end
  local phase = r.phase
  if phase and phase ~= '' then
    -- Flag `p`: the phase follows the fence fields (a phase id holds no '|'). A record has a
    -- phase only from decode (flagged) or from reserve.lua, which makes it flagged.
    return r.state .. '|' .. r.qty .. '|' .. r.ver .. '|' .. r.created .. '|' .. r.deadline
      .. '|' .. r.done .. '|' .. r.reason .. '|' .. flags .. '|' .. r.fence .. '|' .. r.prior
      .. '|' .. r.busy .. '|' .. phase .. '|' .. r.user
  end
  -- One concatenation (no table to join): a batch encodes a record per reservation.
  return r.state .. '|' .. r.qty .. '|' .. r.ver .. '|' .. r.created .. '|' .. r.deadline .. '|'
    .. r.done .. '|' .. r.reason .. '|' .. flags .. '|' .. r.fence .. '|' .. r.prior .. '|'
    .. r.busy .. '|' .. r.user
end

-- A forward of the reservation leaves for the backend at `now` and may take `trip` ms: the
-- fence moves, and the in-flight window of the forwards before it becomes prior.
local function forwarded(r, now, trip)
  r.fence = int(tonumber(r.fence) + 1)
  r.prior = r.busy
  r.busy = int(math.max(tonumber(r.busy), now + trip))
end

-- Whether a hash still holds the '' placeholder prewarm gave it. A hash without it was lost
-- (removed by hand, evicted, or lost with Redis's data) or never prewarmed; scripts never write
-- into such a hash on the buyer's path, so no key is ever re-created without an expiry.
local function marked(hash)
  return redis.call('HEXISTS', hash, '') == 1
end

-- The reservation records a segment holds, and their life. res only ever grows (records are
-- never removed, only expire with the sale) within one life: its placeholder's value names it
-- (Redis's TIME in us when the hash was made; a recount, or a newer version put on sale over a
-- loss, starts a new one). A segment holding fewer records of a life than a gateway saw it hold
-- when it acknowledged a sale forgot that sale: the store went back (an older snapshot, a
-- replica that missed writes). A hash made again (an emptied Redis) is another life: what was
-- lost then is found by the versions the gateways saw on sale (prewarm). One HGET and one HLEN.
-- Returns the count (0 when the hash or its placeholder is gone) and the life ('' then).
-- See src/stock/failover/watermark.rs.
local function records_of(res)
  local life = redis.call('HGET', res, '')
  if not life then
    return 0, ''
  end
  return redis.call('HLEN', res), life
end

-- Whether life `a` is older than life `b` (lives are Redis TIME in us, of one width until the
-- year 2286: compared as strings).
local function older(a, b)
  return #a < #b or (#a == #b and a < b)
end

-- The newer of two lives ('' none).
local function newer_of(a, b)
  if a == '' or (b ~= '' and older(a, b)) then
    return b
  end
  return a
end

-- A new life for a segment's records (see records_of), after `after` (the newest life the
-- caller knows of; '' none): a master whose clock is behind never starts an older one.
local function new_life(after)
  local t = redis.call('TIME')
  local life = t[1] .. string.format('%06d', tonumber(t[2]))
  if after and after ~= '' and not older(after, life) then
    life = string.format('%.0f', tonumber(after) + 1)
  end
  return life
end

-- Whether a segment holding `count` records of `life` forgot records a gateway saw it hold
-- (`most`, of life `seen_life`): fewer of that life, or an older life (the store went back to
-- a snapshot taken before the life the gateway saw began). A hash gone ('' life) says nothing
-- here (what was on sale tells, prewarm).
local function went_back(count, life, most, seen_life)
  if life == '' or seen_life == '' then
    return false
  end
  return older(life, seen_life) or (life == seen_life and count < most)
end

-- Whether a segment's records are of a life newer than the one the caller saw (seen_life), which
-- no operator's recount and no newer version put on sale over a loss started (the `life` field of
-- the segment's known hash, KEYS `known`): the store forgot everything it held and its records were
-- made again (an emptied or flushed Redis whose stock another gateway, with nothing in memory,
-- created again from its configuration). A gateway that saw the older life is refused there at its
-- next call, not at its next master check. One HGET, only when the lives differ. The reserve
-- asks it only for a version the caller sold in the life it saw (a newer version, put on sale
-- after the sale's keys expired, is another sale), and so does an abandon's tombstone (it holds
-- back only where the reserve it stops is refused); the sweep holds back in any newer life the
-- caller did not see begin, until its own sales tell it the life.
local function renewed_unseen(life, seen_life, known)
  return seen_life ~= '' and life ~= '' and older(seen_life, life)
    and redis.call('HGET', known, 'life') ~= life
end

-- Appends an event to the segment's stream, capped at about maxlen entries. A stream that is
-- gone is not re-created here (it would have no expiry): prewarm reports the segment damaged.
local function emit(events, maxlen, ...)
  if redis.call('EXISTS', events) == 1 then
    redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', ...)
  end
end

-- Appends one entry of `kind` naming several reservations: their `jti`, `user` and `qty`
-- joined by a line break, in order (one reservation: its values as they are), then the entry's
-- other fields (...). The caller knows the stream exists (a batch asks once). Nothing for none.
local function emit_batch(events, maxlen, kind, jtis, users, qtys, ...)
  if #jtis == 1 then
    redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', 'type', kind, 'jti', jtis[1],
      'user', users[1], 'qty', qtys[1], ...)
  elseif #jtis > 1 then
    redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', 'type', kind,
      'jti', table.concat(jtis, '\n'), 'user', table.concat(users, '\n'),
      'qty', table.concat(qtys, '\n'), ...)
  end
end

-- Moves a pending or confirmed reservation to released: the user's units come back, and the
-- units go back to their version's stock if that version is still on sale here (its stock key
-- exists), else are counted retired (stock is never created from nothing, and a retired version
-- never sells again). k: {res, users, stock, ledger, pending, events, maxlen}.
-- Returns the units now remaining in that version, or -1 if they were retired.
local function give_back(k, jti, rec, now, reason)
  local from = rec.state
  local qty = tonumber(rec.qty)
  if marked(k.users) and redis.call('HINCRBY', k.users, rec.user, -qty) <= 0 then
    redis.call('HDEL', k.users, rec.user)
  end
  redis.call('ZREM', k.pending, jti)
  local has_ledger = redis.call('EXISTS', k.ledger) == 1
  if has_ledger then
    redis.call('HINCRBY', k.ledger, from, -qty)
    redis.call('HINCRBY', k.ledger, 'released', qty)
    if from == 'pending' and flagged(rec, 'd') then
      redis.call('HINCRBY', k.ledger, 'held_in_doubt', -qty)
    end
  end
  local remaining = -1
  if redis.call('EXISTS', k.stock) == 1 then
    remaining = redis.call('INCRBY', k.stock, qty)
    rec.flags = rec.flags .. 'k'
  else
    rec.flags = rec.flags .. 'x'
    if has_ledger then
      redis.call('HINCRBY', k.ledger, 'retired', qty)
    end
  end
  rec.state = 'released'
  rec.done = now
  rec.reason = reason
  redis.call('HSET', k.res, jti, encode(rec))
  emit(k.events, k.maxlen, 'type', 'release', 'jti', jti, 'user', rec.user, 'qty', rec.qty,
    'ver', rec.ver, 'from', from, 'reason', reason, 'ts', now)
  return remaining
end

-- Second half of a transfer: units withdrawn from another segment arrive here, once per
-- transfer id, into the version they left (never into another version). If that version is no
-- longer on sale here they are counted retired. k: {stock, ledger, received}.
-- Returns 1 deposited, 0 already deposited, -1 no ledger of that version here, -2 the received
-- book is gone (lost: it can no longer tell whether this transfer arrived before). On -1 and -2
-- nothing changes: the transfer stays in flight, and reconcile shows it.
local function deposit(k, id, qty)
  if not marked(k.received) then
    return -2
  end
  if redis.call('HEXISTS', k.received, id) == 1 then
    return 0
  end
  if redis.call('EXISTS', k.ledger) == 0 then
    return -1
  end
  redis.call('HSET', k.received, id, qty)
  redis.call('HINCRBY', k.ledger, 'moved_in', qty)
  if redis.call('EXISTS', k.stock) == 1 then
    redis.call('INCRBY', k.stock, qty)
  else
    redis.call('HINCRBY', k.ledger, 'retired', qty)
    redis.call('HINCRBY', k.ledger, 'unsold_retired', qty)
  end
  return 1
end

-- The failover fence (see src/stock/failover.rs). Each segment records, beside its stock, the
-- identity of the master its stock was accepted under (<tag>:master, INFO replication's
-- master_replid), replicated with the stock. A replica promoted, or a master restarted under a
-- new replication id, answers with another identity than the one recorded: its data may lack
-- the last writes the old master acknowledged, so nothing is sold here until an operator
-- accepts the new master (resume). Costs one INFO and one GET a script call.
local function replid_in(info)
  return string.match(info, 'master_replid:(%w+)') or ''
end

-- Whether stock may be taken under `key`'s record: the recorded identity is this master's;
-- with none recorded, `expected` (the gateway's memory of this segment's master, '' if it has
-- none) must be this master's. Returns the verdict, this master's identity and the record.
-- The usual case (the record is this master's) is a plain search for its line in INFO's text,
-- cheaper than the pattern (callgrind: the fence's 42,000 instructions a call became 34,000);
-- any other answer is the pattern's.
local function master_holds(key, expected)
  local info = redis.call('INFO', 'replication')
  local recorded = redis.call('GET', key)
  if recorded then
    -- A record without a line break found as a whole line is that line's rest: the identity
    -- (one with a line break could span lines, and is left to the pattern).
    if not string.find(recorded, '\r', 1, true)
        and string.find(info, 'master_replid:' .. recorded .. '\r\n', 1, true) then
      return true, recorded, recorded
    end
    local current = replid_in(info)
    return recorded == current, current, recorded
  end
  local current = replid_in(info)
  return expected == '' or expected == current, current, false
end
