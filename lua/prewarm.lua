-- flashgate prewarm: create a stock version from the configuration, once.
--
-- KEYS[1] stock key of the version   KEYS[2] its ledger   KEYS[3] the activity's set of versions
-- ARGV[1] configured stock   ARGV[2] version   ARGV[3] expire-at (unix s)
--
-- Returns 1 created, 0 already there, -1 the ledger exists but the stock key does not (someone
-- removed it): never re-created, since that would put sold units on sale again.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1], 'EXAT', ARGV[3])
redis.call('HSET', KEYS[2], 'initial', ARGV[1], 'pending', 0, 'confirmed', 0, 'released', 0,
  'retired', 0, 'moved_in', 0, 'moved_out', 0)
redis.call('EXPIREAT', KEYS[2], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('EXPIREAT', KEYS[3], ARGV[3])
return 1
