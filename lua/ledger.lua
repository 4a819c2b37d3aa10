-- flashgate ledger: one version's stock and ledger, read in one atomic step (read only).
--
-- KEYS[1] stock key   KEYS[2] ledger   KEYS[3] pending deadlines
-- Returns {stock key exists (0/1), remaining, initial, pending, confirmed, released, retired,
--          ledger exists (0/1), pending reservations, moved in, moved out}

local stock = redis.call('GET', KEYS[1])
local l = redis.call('HMGET', KEYS[2], 'initial', 'pending', 'confirmed', 'released', 'retired',
  'moved_in', 'moved_out')
local n = function(v) return tonumber(v or '0') end
return {stock and 1 or 0, n(stock), n(l[1]), n(l[2]), n(l[3]), n(l[4]), n(l[5]),
  redis.call('EXISTS', KEYS[2]), redis.call('ZCARD', KEYS[3]), n(l[6]), n(l[7])}
