-- flashgate acknowledge: the giving segment learns its transfer arrived: it moves from the
-- transfers still to deliver to the acknowledged ones (kept, so that reconcile can add up every
-- unit the segment moved out). (lib.lua is prepended.)
--
-- KEYS[1] transfers not yet acknowledged   KEYS[2] acknowledged transfers
-- ARGV[1] transfer id
--
-- Returns 1 acknowledged, 0 unknown or acknowledged before.

local t = redis.call('HGET', KEYS[1], ARGV[1])
if not t then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], t)
return 1
