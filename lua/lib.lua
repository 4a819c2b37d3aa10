-- flashgate shared Lua: prepended to the lifecycle scripts when they are loaded.
--
-- A reservation record is a JSON object in the activity's reservations hash (field = jti):
--   {state = pending|confirmed|released, user, qty, ver, created_ms, deadline_ms,
--    confirmed_ms?, released_ms?, reason?, returned? (1: units went back to stock, 0: retired)}
-- Per stock version (and segment) a ledger hash keeps units: initial, pending, confirmed,
-- released, retired, moved_in, moved_out (segment rebalancing), so that at every moment:
-- initial + moved_in - moved_out == remaining + pending + confirmed + retired.

local function emit(events, maxlen, ...)
  redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', ...)
end

-- Moves a pending or confirmed reservation to released: its units go back to its own version's
-- stock key, or, if that key is gone or the version is retired (no longer the one on sale,
-- current ~= '1'), are counted as retired (stock is never created from nothing, and a retired
-- version never sells again). Returns the units now remaining in that version, or -1 if retired.
local function give_back(res, users, stock, ledger, pending, events, maxlen, jti, rec, now, reason,
                         current)
  local from = rec.state
  local qty = rec.qty
  rec.state = 'released'
  rec.released_ms = tonumber(now)
  rec.reason = reason
  if redis.call('HINCRBY', users, rec.user, -qty) <= 0 then
    redis.call('HDEL', users, rec.user)
  end
  redis.call('ZREM', pending, jti)
  local has_ledger = redis.call('EXISTS', ledger) == 1
  if has_ledger then
    redis.call('HINCRBY', ledger, from, -qty)
    redis.call('HINCRBY', ledger, 'released', qty)
  end
  local remaining = -1
  if current == '1' and redis.call('EXISTS', stock) == 1 then
    remaining = redis.call('INCRBY', stock, qty)
    rec.returned = 1
  else
    rec.returned = 0
    if has_ledger then
      redis.call('HINCRBY', ledger, 'retired', qty)
    end
  end
  redis.call('HSET', res, jti, cjson.encode(rec))
  emit(events, maxlen, 'type', 'release', 'jti', jti, 'user', rec.user, 'qty', qty,
    'ver', rec.ver, 'from', from, 'reason', reason, 'ts', now)
  return remaining
end
