-- flashgate restock: add units to the version on sale in one segment, once per Idempotency-Key,
-- counted in the ledger (restocked). (lib.lua is prepended.)
--
-- KEYS[1] stock of the version   KEYS[2] ledger of the version   KEYS[3] restocks (key -> units)
-- KEYS[4] events
-- ARGV[1] units (>= 1)   ARGV[2] idempotency key ('' for none)   ARGV[3] version
-- ARGV[4] when the segment's keys expire (unix s)   ARGV[5] stream cap
-- ARGV[6] the variant restocked ('' for an activity without variants): a drop's variants share
-- one book (KEYS[3] is the activity's), so a key restocks one variant once, and the same key
-- naming another variant is refused
--
-- Returns {1, remaining} added; {0, remaining} this key's restock was added before (nothing
-- changed); {-1, 0} the version is not on sale here (no stock key: never prewarmed, retired by a
-- newer version, or its keys expired): nothing changed; {-2, 0} its ledger is gone (damaged);
-- {-3, remaining} the stock or the ledger's count would pass 2^53 - 1 (numbers stay exact
-- below it): nothing changed; {-4, variant} the key restocked another variant (nothing changed).
--
-- The book of keys lives as long as the stock key does (its expiry is the later of the stock's
-- and ARGV[4], and prewarm extends it with the segment's other keys): a key is never forgotten
-- while the version it restocked can still sell.
--
-- The ledger then reads initial + moved_in - moved_out + restocked ==
-- remaining + pending + confirmed + retired; initial stays the configured stock (a restock is not
-- a stock change for a reload).

local stock, ledger, book, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if ARGV[2] ~= '' then
  -- 'version:units' (an activity without variants), or 'version:units:variant'.
  local done = redis.call('HGET', book, ARGV[2])
  if done then
    local lane = string.match(done, '^%d+:%d+:(.*)$') or ''
    if lane ~= (ARGV[6] or '') then
      return {-4, lane}
    end
    return {0, tonumber(redis.call('GET', stock) or '0')}
  end
end
if redis.call('EXISTS', stock) == 0 then
  return {-1, 0}
end
if redis.call('EXISTS', ledger) == 0 then
  return {-2, 0}
end
local EXACT = 9007199254740991
local units = tonumber(ARGV[1])
local left = tonumber(redis.call('GET', stock))
if left + units > EXACT
    or tonumber(redis.call('HGET', ledger, 'restocked') or '0') + units > EXACT then
  return {-3, left}
end
local remaining = redis.call('INCRBY', stock, ARGV[1])
local at = int(now_ms())
-- restock@<ms>: the units added then (for `flashgate report`'s stock over time; a field a
-- restock, an operator's act).
redis.call('HINCRBY', ledger, 'restocked', ARGV[1])
redis.call('HINCRBY', ledger, 'restock@' .. at, ARGV[1])
if ARGV[2] ~= '' then
  local lane = (ARGV[6] or '') ~= '' and ':' .. ARGV[6] or ''
  redis.call('HSET', book, ARGV[2], ARGV[3] .. ':' .. ARGV[1] .. lane)
  extend(book, int(math.max(tonumber(ARGV[4]), redis.call('EXPIRETIME', stock))))
end
emit(events, ARGV[5], 'type', 'restock', 'qty', ARGV[1], 'ver', ARGV[3], 'key', ARGV[2],
  'ts', at)
return {1, remaining}
