-- flashgate master check: the failover fence of one segment, and what the gateways know the
-- segment must hold (see src/stock/failover.rs). Every gateway calls it for every segment every
-- second; an operator's resume accepts; a gateway that finds the segment's keys lost marks it.
-- O(1). (lib.lua is prepended.)
--
-- KEYS[1] the segment's master record: the identity (INFO replication's master_replid) of the
--         master its stock was accepted under, or 'lost' (the store forgot what it sold: only a
--         recount, recount.lua, or a newer version lifts it), or 'born' (made after its sale
--         opened, on hold: see prewarm.lua)
-- KEYS[2] known (hash): what the gateways know of the segment, kept beside it:
--           hw        '<life>|<n>': the most records of a life any gateway saw it hold when it
--                     acknowledged a sale (see records_of in lib.lua), written back by every
--                     gateway while the segment is fenced or lost
--           persist   '<replid>|<appendonly>|<appendfsync>|<replicas>': the accepted master's
--                     persistence as the gateways last read it (CONFIG GET), and the most
--                     replicas seen connected to it
--           fenced_at when a gateway first saw the current fence (Redis ms)
--           lost      '<version>|<reason>|<held>|<hw>|<at>': the segment was found to hold
--                     less than was sold (reason behind or keys_lost)
--           lifted    '<reason>|<at>': the last fence a rule lifted
--           recount   '<units>|<at>': the last recount (recount.lua)
--           unacked   when a gateway last reported a fate write not acknowledged by its
--                     replicas (Redis ms, ARGV[11])
--           run       the run_id (INFO server) of the process the master was accepted under
--           life      the life of the records a recount or a newer version put on sale over a
--                     loss started (recount.lua, prewarm.lua): the only lives that may follow
--                     one a gateway saw while the sale goes on
--           orders    when `flashgate reconcile --orders` last found nothing of the activity's
--                     orders missing or in doubt (Redis ms, ARGV[3] 'orders'): a plain resume
--                     of a fence needs one since the fence began
-- KEYS[3] res: the segment's reservation records (a hash only ever grown within a life, so
--         its length counts what the segment must hold)   KEYS[4] meta (the version on sale)
-- ARGV[1] the identity this gateway last saw accepted here ('' if none)
-- ARGV[2] expire-at (unix s)
-- ARGV[3] '' check, 'accept' (an operator's resume), 'lost:<reason>[:<recount stamp>]' (a
--         gateway found the segment's keys lost: marked whatever else holds, unless it names
--         the recount stamp it read with what it found and the segment was recounted since),
--         'orders' (reconcile --orders found nothing missing or in doubt: recorded, nothing
--         else)
-- ARGV[4] the most records this gateway saw the segment hold when it acknowledged a sale,
-- ARGV[5] of which life
-- ARGV[6] the persistence of the master answering, as this gateway read it just now
--         ('<appendonly>|<appendfsync>'; '' when CONFIG GET was refused: no rule applies)
-- ARGV[7] this gateway's redis.ack_replicas (0: none)
-- ARGV[8] how long a fence stands before a rule may lift it (ms): every gateway's check has
--         written back what it saw by then
-- ARGV[9] the version this gateway sells (a loss names the version on sale, else this one)
-- ARGV[10] the newest version of a sale this gateway acknowledged in the life of ARGV[5]
-- ARGV[11] '1' while this gateway holds a write deciding units' fate (a confirm, a release, a
--          sweep's expiry) that fewer than its redis.ack_replicas replicas acknowledged, or
--          whose answer was lost ('' none): recorded in known as `unacked`, the latest such
--          report (Redis ms); replicas_acknowledged then lifts no fence begun within settle_ms
--          after it (see lift_rule)
-- ARGV[12] when this gateway saw version ARGV[9] go on sale in this segment (unix ms, the
--          meta's `v:<version>` it read then; 0 it did not): the meta naming another birth of
--          it, with no recount since, is a stock made again after the store forgot it (by a
--          gateway that never saw it on sale), whether or not this gateway sold any of it
--
-- Returns {verdict, current, recorded, held, life, detail}: verdict
--   'ok'        the record is this master's
--   'armed'     none was recorded, and the gateway's memory is empty or this master's: now it is
--   'fenced'    another master's (or none, and the gateway remembers another)
--   'lost'      the segment holds less than was sold (detail: the reason): only a recount or a
--               newer version lifts it; a plain accept is refused
--   'accepted'  ARGV[3] accept: recorded now
--   'unchecked' ARGV[3] accept of a fence (a promoted replica, a restart that was not durable:
--               either may have lost acknowledged sales) before `reconcile --orders` found
--               nothing missing since the fence began: refused, nothing accepted (in doubt,
--               hold); the operator runs it, or resumes with a count
--   'settling'  ARGV[3] accept of a fence that began less than ARGV[8] ago (detail: the ms left):
--               nothing accepted; asked again once it stood that long
--   'checked'   ARGV[3] orders: recorded
--   'born'      a stock made after its sale opened, still within its hold (see prewarm.lua):
--               sells nothing yet; armed ('armed') once the hold passed
--   'lifted'    a fence lifted by a rule (detail: durable_restart, replicas_acknowledged or
--               same_process)
-- held: the records the segment holds now, life: theirs.

local RECORD, KNOWN, RES = KEYS[1], KEYS[2], KEYS[3]
local expected, expire_at, mode = ARGV[1], ARGV[2], ARGV[3]
local seen, seen_life = tonumber(ARGV[4]) or 0, ARGV[5]
local persistence, ack_replicas = ARGV[6], tonumber(ARGV[7]) or 0
local settle_ms, version = tonumber(ARGV[8]) or 0, ARGV[9]
local seen_version = tonumber(ARGV[10]) or 0
local unacked_now = ARGV[11] == '1'
local remembered_birth = tonumber(ARGV[12]) or 0

local info = redis.call('INFO', 'replication')
local current = replid_in(info)
local recorded = redis.call('GET', RECORD)
local k = redis.call('HMGET', KNOWN, 'hw', 'persist', 'fenced_at', 'lost', 'recount', 'life',
  'run', 'orders')
local persist, fenced_at, lost = k[2], tonumber(k[3] or ''), k[4]
local held, life = records_of(RES)
local now = now_ms()
-- A gateway holds a fate write its replicas did not acknowledge: said beside the segment, on
-- every path (a fence begun after it must not lift by replicas_acknowledged).
if unacked_now then
  redis.call('HSET', KNOWN, 'unacked', int(now))
  extend(KNOWN, expire_at)
end

-- What every gateway saw of this life of the records, together (a count of another life says
-- nothing of this one).
local hw_life, hw_n = string.match(k[1] or '', '^(.*)|(%d+)$')
local hw = hw_life == life and tonumber(hw_n) or 0
local most = hw
if seen_life == life and seen > most then
  most = seen
end
-- Or the records are of an older life than one a gateway saw (an older snapshot).
local back = went_back(held, life, seen, seen_life)
  or (hw_life ~= nil and went_back(held, life, tonumber(hw_n), hw_life))
-- Or the records are gone (the hash, or its placeholder) while a gateway saw some, before the
-- sale's keys were due to expire: an emptied or flushed store, an evicted or deleted hash.
local gone = life == '' and seen > 0 and seen_life ~= '' and now < tonumber(expire_at) * 1000
-- Or the records were made again, in a newer life no recount or newer version started, while
-- the version on sale is still one a gateway sold in the life it saw: an emptied or flushed
-- store whose stock another gateway (with nothing in memory) created again from its YAML.
local function renewed()
  if seen == 0 or seen_life == '' or life == '' or not older(seen_life, life) or k[6] == life
      or now >= tonumber(expire_at) * 1000 then
    return false
  end
  local on_sale = tonumber(redis.call('HGET', KEYS[4], 'current') or '') or 0
  return on_sale <= seen_version
end

-- Or the version this gateway saw go on sale here was born again since (the meta's birth of it
-- is another), and no recount started that: made again from a YAML over what was sold of it,
-- even if this gateway sold none of it itself (what it saw on sale is enough).
local function born_again()
  if remembered_birth == 0 or now >= tonumber(expire_at) * 1000 then
    return false
  end
  local born = tonumber(redis.call('HGET', KEYS[4], 'v:' .. version) or '')
  if not born or born == remembered_birth then
    return false
  end
  local recounted = tonumber(string.match(k[5] or '', '|(%d+)$') or '0') or 0
  return recounted < born
end

local function reply(verdict, detail)
  return {verdict, current, recorded or '', int(held), life, detail or ''}
end

-- While fenced or lost, each gateway writes back what it saw, so every gateway (one started
-- later, with nothing in memory) and reconcile can tell whether the store is behind.
local function write_back()
  if most > hw then
    redis.call('HSET', KNOWN, 'hw', life .. '|' .. int(most))
  elseif seen > 0 and older(life, seen_life) and (not hw_life or older(hw_life, seen_life)) then
    -- A count of a newer life than the records hold (they went back to an older one, or are
    -- gone): kept for reconcile to show, and for gateways with nothing in memory. A count of
    -- an older life says nothing (a recount or a newer version started the one held now).
    redis.call('HSET', KNOWN, 'hw', seen_life .. '|' .. int(seen))
  end
  if not fenced_at then
    fenced_at = now
    redis.call('HSET', KNOWN, 'fenced_at', int(now))
  end
  extend(KNOWN, expire_at)
end

local function mark_lost(reason)
  version = redis.call('HGET', KEYS[4], 'current') or version
  lost = version .. '|' .. reason .. '|' .. int(held) .. '|' .. int(most) .. '|' .. int(now)
  redis.call('HSET', KNOWN, 'lost', lost)
  redis.call('SET', RECORD, 'lost')
  extend(RECORD, expire_at)
  write_back()
  return reply('lost', reason)
end

local function lost_reason()
  return string.match(lost or '', '^[^|]*|([^|]*)') or 'lost'
end

-- The process answering now (INFO server's run_id: a restart or another server has another).
local function run_id()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
end

-- The accepted master's process (written only when it changed), then its persistence, as read
-- now.
local function record_persistence()
  local run = run_id()
  if run ~= '' and run ~= k[7] then
    redis.call('HSET', KNOWN, 'run', run)
    extend(KNOWN, expire_at)
  end
  if persistence == '' then
    return
  end
  local replicas = tonumber(string.match(info, 'connected_slaves:(%d+)') or '0')
  local id, _, _, before = string.match(persist or '', '^(%w+)|([^|]*)|([^|]*)|(%d+)$')
  if id == current and tonumber(before) > replicas then
    replicas = tonumber(before)
  end
  local value = current .. '|' .. persistence .. '|' .. int(replicas)
  if value ~= persist then
    redis.call('HSET', KNOWN, 'persist', value)
    extend(KNOWN, expire_at)
  end
end

-- A fence no rule of the contract lifts stays until an operator's resume; these two lift it
-- once it stood settle_ms (so every live gateway wrote back what it saw) and nothing any
-- gateway saw is missing:
--   durable_restart: the same server restarted (a promoted replica has the recorded identity as
--     master_replid2), having run with appendonly yes and appendfsync always as recorded (it
--     acknowledged nothing it had not written to disk);
--   replicas_acknowledged: a promoted replica of the recorded master, while every gateway waits
--     for at least as many replicas as that master ever had connected (redis.ack_replicas), and
--     no gateway reported a fate write its replicas did not acknowledge (`unacked`) since the
--     fence began or within settle_ms before it (a confirm the replica never got would leave
--     the unit pending there, to expire and sell again);
--   same_process: the very process the master was accepted under (its run_id), never a replica
--     since (master_replid2 unset): Redis gave itself a new replication id without losing
--     anything (its first replica attached, and it made a backlog under a new id).
local function lift_rule()
  if not fenced_at or now - fenced_at < settle_ms or not recorded or held < most
      or not marked(RES) then
    return nil
  end
  local replid2 = string.match(info, 'master_replid2:(%w+)') or ''
  if k[7] and k[7] == run_id() and string.match(replid2, '^0+$') then
    return 'same_process'
  end
  local id, aof, fsync, replicas = string.match(persist or '', '^(%w+)|([^|]*)|([^|]*)|(%d+)$')
  if id ~= recorded then
    return nil
  end
  if replid2 ~= recorded and aof == 'yes' and fsync == 'always' then
    return 'durable_restart'
  end
  replicas = tonumber(replicas)
  local unacked = tonumber(redis.call('HGET', KNOWN, 'unacked') or '')
  if replid2 == recorded and replicas >= 1 and ack_replicas >= replicas
      and not (unacked and unacked >= fenced_at - settle_ms) then
    return 'replicas_acknowledged'
  end
  return nil
end

-- Whether a fence stands for this caller: the record names another master, or none is recorded
-- and the caller remembers another.
local stands = (recorded and recorded ~= current)
  or (not recorded and expected ~= '' and expected ~= current)

if mode == 'orders' then
  -- A fence standing now began no later than this check (a plain resume compares the two).
  if stands and not fenced_at then
    fenced_at = now
    redis.call('HSET', KNOWN, 'fenced_at', int(now))
  end
  redis.call('HSET', KNOWN, 'orders', int(now))
  extend(KNOWN, expire_at)
  return reply('checked')
end

local marking, since = string.match(mode, '^lost:([^:]+):?(%d*)$')
-- A recount since the finder read what it found (its stamp differs): what it found is stale.
local recount_at = string.match(k[5] or '', '|(%d+)$') or '0'
if marking and since ~= '' and since ~= recount_at then
  marking = nil
end
if marking and not lost then
  return mark_lost(marking)
end
if lost or recorded == 'lost' then
  write_back()
  return reply('lost', lost_reason())
end
-- The store went back: it holds fewer records of this life than a gateway saw it hold, or an
-- older life.
if held < most or back then
  return mark_lost('behind')
end
if gone or renewed() or born_again() then
  return mark_lost('keys_lost')
end
-- Born on hold (prewarm.lua: a stock made after its sale opened, in a segment that had none):
-- armed once it stood settle_ms with no gateway finding it made again over what it sold (the
-- checks above mark that lost first), or by an operator's resume.
if recorded == 'born' then
  local born = tonumber(redis.call('HGET', KNOWN, 'born') or '') or 0
  if mode ~= 'accept' and now - born < settle_ms then
    return reply('born')
  end
  redis.call('SET', RECORD, current)
  extend(RECORD, expire_at)
  redis.call('HDEL', KNOWN, 'born', 'fenced_at')
  record_persistence()
  return reply('armed')
end
if mode == 'accept' then
  -- In doubt, hold: a fence no rule lifted may hide sales the replaced master acknowledged
  -- (a promoted replica, a restart that was not durable). Accepted only once the backend's
  -- orders were found whole since it began.
  if stands then
    write_back()
    -- Every live gateway writes back what it saw within settle_ms of the fence (each checks
    -- every second): accepted before then, a count only another gateway holds (a store gone
    -- back under sales made through that one) would be missed. The caller waits and asks again.
    if now - fenced_at < settle_ms then
      return reply('settling', int(settle_ms - (now - fenced_at)))
    end
    local checked = tonumber(k[8] or '')
    if not checked or checked < fenced_at then
      return reply('unchecked')
    end
  end
  redis.call('SET', RECORD, current)
  extend(RECORD, expire_at)
  if fenced_at then
    redis.call('HDEL', KNOWN, 'fenced_at')
  end
  record_persistence()
  return reply('accepted')
end
-- What the gateways saw, kept beside the segment whenever it grows (not only while fenced): a
-- gateway restarted later still finds the segment gone back.
if most > hw and (recorded == current or not recorded) then
  redis.call('HSET', KNOWN, 'hw', life .. '|' .. int(most))
  extend(KNOWN, expire_at)
end
if recorded == current then
  record_persistence()
  extend(RECORD, expire_at)
  return reply('ok')
end
if not recorded and (expected == '' or expected == current) then
  redis.call('SET', RECORD, current)
  extend(RECORD, expire_at)
  record_persistence()
  return reply('armed')
end
write_back()
local rule = lift_rule()
if rule then
  redis.call('SET', RECORD, current)
  extend(RECORD, expire_at)
  redis.call('HDEL', KNOWN, 'fenced_at')
  redis.call('HSET', KNOWN, 'lifted', rule .. '|' .. int(now))
  record_persistence()
  return reply('lifted', rule)
end
return reply('fenced')
