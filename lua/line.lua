-- flashgate line: a lane's second-chance line (activities[].second_chance): buyers told
-- sold_out who joined, in order; each unit that comes back is held for the next one in line
-- for the window, then passes to the one after. (lib.lua is prepended.)
--
-- While anyone waits in the line, every unit of the lane is the line's: the reserve script
-- sells only to a buyer holding one (a `hold`), and tells everyone else sold out (-15).
--
-- KEYS[1] stock of the version on sale   KEYS[2] line (zset: user -> place, in order of joining)
-- KEYS[3] holds (hash: user -> when their hold runs out, unix ms)   KEYS[4] the ledger
-- KEYS[5] users (units held, for the limit)   KEYS[6] the activity's halt (admin API)
-- ARGV[1] 'join', 'advance' or 'poll'   ARGV[2] the user ('' for advance)
-- ARGV[3] the hold's window (ms)   ARGV[4] when the keys expire (unix s)
-- ARGV[5] per-user limit (join: a buyer at the limit cannot use a unit)
--
-- Advance (every call does it first): the first min(units left, waiting) buyers in the line
-- each hold a unit until their window runs out; a hold that ran out leaves the line (its
-- chance passes to the next), counted in the ledger's `line_lapsed`. At most MAX_STEPS rounds
-- of lapses a call (the rest at the next call: every gateway advances each line every second).
--
-- Returns {code, place, waiting, held, hold_left_ms}:
--   code 1 joined (or already in line), 2 polled, 3 advanced, -1 not sold out (join refused:
--   buy directly), -2 the buyer already holds the limit (join refused), -3 not in the line (poll)
--   place: the buyer's place (1 = next), 0 when not in line; waiting: buyers in line;
--   held: units held for the line now; hold_left_ms: the buyer's hold left (0: none)

local STOCK, LINE, HOLDS, LEDGER, USERS, HALT = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  KEYS[6]
local mode, user, window, expire_at = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local MAX_HEADS, MAX_STEPS = 64, 8
local now = now_ms()

local function left()
  return math.max(tonumber(redis.call('GET', STOCK) or '0') or 0, 0)
end

-- While the activity is halted nobody can buy: the line stands, and every hold is kept whole
-- (its window starts again when the sale resumes), as the waiting room's cursor stands.
local function stand()
  local held = redis.call('HGETALL', HOLDS)
  local fields = {}
  for i = 1, #held, 2 do
    local at = tonumber(held[i + 1]) or 0
    if at < now + window then
      fields[#fields + 1] = held[i]
      fields[#fields + 1] = int(now + window)
    end
  end
  if #fields > 0 then
    redis.call('HSET', HOLDS, unpack(fields))
  end
end

-- The line's heads hold a unit each; lapsed holds leave the line.
local function advance()
  if redis.call('EXISTS', HALT) == 1 then
    return stand()
  end
  for _ = 1, MAX_STEPS do
    local n = math.min(left(), MAX_HEADS)
    if n <= 0 then
      return
    end
    local heads = redis.call('ZRANGE', LINE, 0, n - 1)
    if #heads == 0 then
      return
    end
    local until_ms = redis.call('HMGET', HOLDS, unpack(heads))
    local lapsed, fresh = 0, {}
    for i, head in ipairs(heads) do
      local at = tonumber(until_ms[i] or '')
      if not at then
        fresh[#fresh + 1] = head
        fresh[#fresh + 1] = int(now + window)
      elseif at <= now then
        redis.call('ZREM', LINE, head)
        redis.call('HDEL', HOLDS, head)
        lapsed = lapsed + 1
      end
    end
    if #fresh > 0 then
      redis.call('HSET', HOLDS, unpack(fresh))
      extend(HOLDS, expire_at)
    end
    if lapsed == 0 then
      return
    end
    redis.call('HINCRBY', LEDGER, 'line_lapsed', lapsed)
  end
end

local function answer(code)
  local rank = user ~= '' and redis.call('ZRANK', LINE, user) or false
  local hold = user ~= '' and tonumber(redis.call('HGET', HOLDS, user) or '') or nil
  return {code, rank and rank + 1 or 0, redis.call('ZCARD', LINE), redis.call('HLEN', HOLDS),
    hold and math.max(hold - now, 0) or 0}
end

advance()
if mode == 'join' then
  if redis.call('ZSCORE', LINE, user) then
    return answer(1)
  end
  if redis.call('ZCARD', LINE) == 0 and left() > 0 then
    return answer(-1)
  end
  if tonumber(redis.call('HGET', USERS, user) or '0') >= tonumber(ARGV[5]) then
    return answer(-2)
  end
  -- In order of joining: one more than the last place ever given.
  local last = redis.call('ZRANGE', LINE, -1, -1, 'WITHSCORES')
  local place = (tonumber(last[2] or '0') or 0) + 1
  redis.call('ZADD', LINE, place, user)
  extend(LINE, expire_at)
  advance()
  return answer(1)
end
if mode == 'poll' then
  if not redis.call('ZSCORE', LINE, user) then
    return answer(-3)
  end
  return answer(2)
end
return answer(3)
