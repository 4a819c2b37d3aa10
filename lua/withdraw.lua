-- flashgate withdraw: take up to ARGV[2] units out of one segment's stock, to move them to
-- another segment (rebalancing a segmented activity). First half of a transfer; the deposit on
-- the receiving segment is the second, idempotent on the transfer id.
--
-- KEYS[1] stock key of the giving segment   KEYS[2] its ledger   KEYS[3] its outgoing transfers
-- ARGV[1] transfer id   ARGV[2] units wanted   ARGV[3] receiving segment   ARGV[4] now (unix ms)
--
-- Returns the units taken (0 when the segment has none). The transfer is recorded until
-- acknowledged, so a gateway dying between the halves leaves it to be delivered by a sweep.

local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
local take = math.min(stock, tonumber(ARGV[2]))
if take <= 0 then
  return 0
end
redis.call('DECRBY', KEYS[1], take)
redis.call('HINCRBY', KEYS[2], 'moved_out', take)
redis.call('HSET', KEYS[3], ARGV[1], cjson.encode({to = ARGV[3], qty = take, ts = tonumber(ARGV[4])}))
return take
