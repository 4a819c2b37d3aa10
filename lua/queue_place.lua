-- flashgate queue place: records the place a gateway admitted a pre-queue ticket at, once per
-- ticket (the first gateway's), so `flashgate draw` can compare the places the gateways used
-- with the places recomputed from the seed. (lib.lua and queue_lib.lua are prepended.) O(1).
--
-- KEYS[1] the queue's places (ticket number -> place)
-- ARGV[1] the ticket number   ARGV[2] its place   ARGV[3] expire-at (unix s)
--
-- Returns 1 if recorded now, 0 if it was already.

local recorded = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
extend(KEYS[1], ARGV[3])
return recorded
