-- flashgate doubt: hold in doubt every reservation of one version still pending in one segment,
-- before an operator resumes it after a fence or a loss (a promoted replica, a restart that was
-- not durable, an older snapshot, a recount). Such a reservation may have been confirmed by the
-- backend on a master whose writes this store lacks: its hold's expiry is no proof that no order
-- holds its unit, so it is flagged d and parked at the HELD score (see lib.lua): the sweep never
-- releases it by expiry; a confirm (the backend's, an admin's, `reconcile --orders
-- --confirm-pending`), an admin release, its own request's failed forward or the order lookup's
-- "no order" ends it. (lib.lua is prepended.)
--
-- O(pending of the version): an operator's call, made while the segment sells nothing.
--
-- The version's ledger counts the units newly held in its held_in_doubt (see lib.lua), if it
-- has a ledger (a ledger that is gone is not made here: a recount makes it again, counted from
-- the records).
--
-- KEYS[1] pending of the version   KEYS[2] res   KEYS[3] ledger of the version
-- Returns the reservations held (newly flagged).

local held, units = 0, 0
for _, jti in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. HELD)) do
  local rec = jti ~= '' and decode(redis.call('HGET', KEYS[2], jti))
  if rec and rec.state == 'pending' and not flagged(rec, 'd') then
    rec.flags = rec.flags .. 'd'
    redis.call('HSET', KEYS[2], jti, encode(rec))
    redis.call('ZADD', KEYS[1], 'XX', HELD, jti)
    held = held + 1
    units = units + tonumber(rec.qty)
  end
end
if units > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'held_in_doubt', units)
end
return held
