-- flashgate withdraw: take up to ARGV[2] units of one version out of one segment's stock, to
-- move them to another segment (rebalancing). First half of a transfer; the deposit on the
-- receiving segment is the second, once per transfer id, into the same version.
-- (lib.lua is prepended.)
--
-- KEYS[1] stock of the version (giving segment)   KEYS[2] its ledger   KEYS[3] its transfers
-- (not yet acknowledged)   KEYS[4] its acknowledged transfers
-- KEYS[5] its master record (the failover fence, see master_holds in lib.lua)   KEYS[6] its
-- reservation records
-- ARGV[1] transfer id   ARGV[2] units wanted   ARGV[3] receiving segment   ARGV[4] version
-- ARGV[5] the master identity the gateway last saw accepted here ('' if none)
-- ARGV[6] the most records the gateway saw it hold when it acknowledged a sale ('0' none),
-- ARGV[7] of which life (see records_of in lib.lua)
--
-- Returns the units taken (0 when the segment has none, or the version is not on sale here),
-- or -1 when fenced (this master is not the one the segment's stock was accepted under, or it
-- holds fewer records than the gateway saw: its stock is too high by what it forgot): nothing
-- taken, not even a retried transfer's answer.
-- Once per transfer id: the same id again (a retried call) returns what it took the first time.
-- The transfer (version|to|units|ms) is recorded until acknowledged, so a gateway dying between
-- the halves leaves it to be delivered by a sweep, then kept as acknowledged: every unit a
-- segment ever moved out is accounted for by its own transfers (see reconcile).

local records, life = records_of(KEYS[6])
if not master_holds(KEYS[5], ARGV[5]) or went_back(records, life, tonumber(ARGV[6]), ARGV[7]) then
  return -1
end
local seen = redis.call('HGET', KEYS[3], ARGV[1]) or redis.call('HGET', KEYS[4], ARGV[1])
if seen then
  return tonumber(string.match(seen, '^%d+|%d+|(%d+)|'))
end
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
local take = math.min(stock, tonumber(ARGV[2]))
if take <= 0 then
  return 0
end
redis.call('DECRBY', KEYS[1], take)
redis.call('HINCRBY', KEYS[2], 'moved_out', take)
redis.call('HSET', KEYS[3], ARGV[1],
  table.concat({ARGV[4], ARGV[3], int(take), int(now_ms())}, '|'))
return take
