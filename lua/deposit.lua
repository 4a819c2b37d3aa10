-- flashgate deposit: second half of a transfer: units arrive in the receiving segment, exactly
-- once per transfer id.
--
-- KEYS[1] stock key of the receiving segment   KEYS[2] its ledger   KEYS[3] transfers it received
-- ARGV[1] transfer id   ARGV[2] units
--
-- Returns 1 deposited, 0 already deposited. If the receiving stock key is gone the units are
-- ledgered as retired (never created from nothing).

if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local qty = tonumber(ARGV[2])
redis.call('HINCRBY', KEYS[2], 'moved_in', qty)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('INCRBY', KEYS[1], qty)
else
  redis.call('HINCRBY', KEYS[2], 'retired', qty)
end
return 1
