-- flashgate ledger: one version's stock and ledger in one segment, read in one atomic step
-- (read only). (lib.lua is prepended.)
--
-- KEYS[1] stock   KEYS[2] ledger   KEYS[3] pending
-- Returns {stock key exists (0/1), remaining, then LEDGER_FIELDS in order (initial, pending,
--          confirmed, released, retired, moved_in, moved_out, unsold_retired, late_accepted,
--          oversold, restocked, recounted, held_in_doubt), ledger exists (0/1),
--          pending reservations}

local stock = redis.call('GET', KEYS[1])
local l = redis.call('HMGET', KEYS[2], unpack(LEDGER_FIELDS))
local out = {stock and 1 or 0, tonumber(stock or '0')}
for i = 1, #LEDGER_FIELDS do
  out[#out + 1] = tonumber(l[i] or '0')
end
out[#out + 1] = redis.call('EXISTS', KEYS[2])
out[#out + 1] = redis.call('ZCOUNT', KEYS[3], '-inf', '(+inf')
return out
