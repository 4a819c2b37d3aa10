-- flashgate fleet tokens: token buckets shared by every gateway (rate_limits scope: fleet), a
-- batch of asks in one call. Each bucket is GCRA's one number, the theoretical arrival time
-- (TAT, unix us): a token is granted when, after it, the TAT is at most `burst` intervals ahead
-- of now. Time is Redis's TIME, so the gateways' clocks never matter. Exact: a bucket grants
-- `burst` at once and one token per interval after, whichever gateways ask. (lib.lua is
-- prepended.) O(1) per ask; a batch is at most 64 asks.
--
-- KEYS[i] the bucket of ask i (all on one hash tag); absent is a full bucket
-- ARGV[2i-1] ask i's interval (us a token: 1e6 / per_second)   ARGV[2i] its burst
--
-- Returns two numbers per ask, in order: 1 granted (the TAT moved on by one interval) or 0
-- refused (nothing taken), then the microseconds until a token would be granted next (0: one is
-- there now), so that neither a refusal nor the grant that emptied a bucket needs asking again
-- before then.
--
-- A bucket expires when it would be full again (its TAT passed): a full bucket and an absent
-- one are the same, so no key outlives its use.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now)
  local next_tat = tat + interval
  local wait = next_tat - interval * burst - now
  if wait > 0 then
    out[2 * i - 1], out[2 * i] = 0, wait
  else
    redis.call('SET', key, int(next_tat), 'PX', math.floor((next_tat - now) / 1000) + 1)
    out[2 * i - 1], out[2 * i] = 1, math.max(next_tat + interval - interval * burst - now, 0)
  end
end
return out
