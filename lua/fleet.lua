-- flashgate fleet: each gateway says it is alive once a second and reads who else is. (lib.lua
-- is prepended.) Bounded whatever the keys hold: at most ROLL_MAX gateways are read and
-- GONE_MAX stale ones dropped a call (a fleet is a handful; more is a key written by hand).
--
-- KEYS[1] the fleet's last-seen times (sorted set: gateway id -> unix ms, Redis's clock)
-- KEYS[2] what each gateway says of itself (hash: gateway id -> its opaque text)
-- ARGV[1] this gateway's id   ARGV[2] its text   ARGV[3] the window (ms): a gateway not seen
-- for longer is dropped from both keys   ARGV[4] both keys' expiry (ms, at least the window)
--
-- Returns {now, id, seen, text, id, seen, text, ...}: now and the gateways seen within the
-- window (this one included; at most ROLL_MAX, the most recently seen), oldest first; seen is
-- unix ms by Redis's clock, so gateways' clocks never matter. A time ahead of now (written by
-- hand) is dropped as stale. Both keys expire when no gateway has written for ARGV[4] ms.

local ROLL_MAX, GONE_MAX = 64, 256
local SEEN, TEXT = KEYS[1], KEYS[2]
local id, text, window, expiry = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
redis.call('ZADD', SEEN, now, id)
redis.call('HSET', TEXT, id, text)
local function drop(min, max)
  local gone = redis.call('ZRANGEBYSCORE', SEEN, min, max, 'LIMIT', 0, GONE_MAX)
  if #gone > 0 then
    redis.call('ZREM', SEEN, unpack(gone))
    redis.call('HDEL', TEXT, unpack(gone))
  end
end
drop('-inf', '(' .. int(now - window))
drop('(' .. int(now), '+inf')
redis.call('PEXPIRE', SEEN, expiry)
redis.call('PEXPIRE', TEXT, expiry)
local seen = redis.call('ZREVRANGEBYSCORE', SEEN, int(now), int(now - window), 'WITHSCORES',
  'LIMIT', 0, ROLL_MAX)
local out = {now}
for i = #seen - 1, 1, -2 do
  out[#out + 1] = seen[i]
  out[#out + 1] = tonumber(seen[i + 1])
  out[#out + 1] = redis.call('HGET', TEXT, seen[i]) or ''
end
return out
