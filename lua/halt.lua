-- flashgate halt and resume (admin API): the activity's fleet-wide stop. The halt key says the
-- activity is halted (its value: since when, unix ms by Redis's clock); every gateway reads it
-- (ARGV[1] '?', every 100 ms) and refuses the activity's sale requests while it exists. The waiting room's
-- cursor stands from the same instant (its state reads follow the key as well, for a queue set
-- up later). (lib.lua and queue_lib.lua are prepended.) O(1), but a stepped queue's resume:
-- O(windows open at the halt), see queue_lengthen.
--
-- The halt key expires with the activity's other keys (the sale's end plus the retention, moved
-- later by every gateway's read when the end is), and never sooner than the retention from now:
-- it is not a floor, since after the retention nothing of the sale is left to halt. A read
-- moves a halt's expiry to the sale's end plus the retention when that is later (an end
-- extended by a reload never lets a halt lapse before the sale's other keys).
--
-- A fenced activity is halted by the gateway that finds the fence (so its waiting room stands),
-- and a rule that lifts the fence lifts that halt: the halt made for a fence carries a mark
-- (KEYS[5]), which an operator's halt or resume removes (an operator's halt is never lifted by
-- a rule, and a fence finding the activity already halted makes no mark).
--
-- KEYS[1] the halt key   KEYS[2] the queue hash (need not exist)   KEYS[3], KEYS[4] the stepped
-- admission's adm and active (a resume lengthens the windows open at the halt; queue_lib.lua)
-- KEYS[5] the mark of a halt made for a fence
-- ARGV[1] '1' halt, '0' resume, '?' read only, 'F' halt for a fence (only if not halted),
-- 'f' lift a halt made for a fence (only if marked)   ARGV[2] expire-at (unix s)
-- ARGV[3] the retention (s)
--
-- Returns {halted (1 or 0), since (unix ms; 0 when not halted)}.

if ARGV[1] == '?' then
  local since = redis.call('GET', KEYS[1])
  if since then
    extend(KEYS[1], ARGV[2])
  end
  return {since and 1 or 0, tonumber(since or '0')}
end
local now = now_ms()
local halt = ARGV[1] == '1' or ARGV[1] == 'F'
local until_s = math.max(tonumber(ARGV[2]), math.floor(now / 1000) + tonumber(ARGV[3]))
if ARGV[1] == 'F' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {1, tonumber(redis.call('GET', KEYS[1]))}
  end
  redis.call('SET', KEYS[5], '1', 'EXAT', until_s)
elseif ARGV[1] == 'f' then
  if redis.call('EXISTS', KEYS[5]) == 0 then
    local since = redis.call('GET', KEYS[1])
    return {since and 1 or 0, tonumber(since or '0')}
  end
else
  redis.call('DEL', KEYS[5])
end
if halt then
  -- A second halt keeps the first one's time.
  redis.call('SET', KEYS[1], int(now), 'NX')
  extend(KEYS[1], until_s)
else
  redis.call('DEL', KEYS[1], KEYS[5])
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  queue_stand(KEYS[2], queue_state(KEYS[2]), 'halted', halt, now, {KEYS[3], KEYS[4]})
end
return {halt and 1 or 0, tonumber(redis.call('GET', KEYS[1]) or '0')}
