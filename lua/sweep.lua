-- flashgate sweep: pending reservations of one version whose time has come (the hold deadline,
-- or the next order lookup). (lib.lua is prepended.) Bounded: at most ARGV[1] reservations per
-- call; the caller calls again while a full batch came back. Any number of instances may sweep
-- at once: a reservation is released only while pending, so exactly once.
--
-- In doubt, hold: a hold's expiry is proof that no order holds its unit only in a store that
-- provably did not lose or go back since the reservation was made. So nothing is released, and
-- nothing handed out, while the segment is fenced or lost for the sweeping gateway (its fencing
-- token, as the reserve's: the master record, the records' life and count it saw), and a
-- reservation held in doubt (flag d, lua/doubt.lua: pending when an operator resumed the
-- segment after a fence or a loss) is never released by expiry: it is parked at the HELD score;
-- with an order lookup it is handed out (the backend's "no order" is proof), never given up.
--
-- KEYS[1] pending of the version   KEYS[2] res   KEYS[3] users   KEYS[4] stock of the version
-- KEYS[5] ledger of the version   KEYS[6] events   KEYS[7] the segment's master record
-- KEYS[8] known (see lua/master.lua)
-- ARGV[1] batch size   ARGV[2] stream cap
-- ARGV[3] lease (ms): 0 releases what is due and past its hold deadline (expired); more hands
--         what is due to the caller to ask the backend about (order lookup), due again after the
--         lease unless settled
-- ARGV[4] give up (ms, with a lease): a reservation still pending this long after its hold
--         deadline is released as expired instead of handed out again; 0 never
-- ARGV[5] the master identity the gateway last saw accepted here ('' none)   ARGV[6] the most
-- records it saw the segment hold   ARGV[7] of which life ('' none)
--
-- Returns {released, units, scanned, retired, jti, fence, jti, fence, ...}: the reservations
-- handed out for lookup, if any, each with the fence the hand-out set (it moves the fence: an
-- answer to an earlier hand-out is discarded); the lookup's "not found" must name it.

local records, life = records_of(KEYS[2])
if not master_holds(KEYS[7], ARGV[5]) or went_back(records, life, tonumber(ARGV[6]), ARGV[7])
    or renewed_unseen(life, ARGV[7], KEYS[8]) then
  return {0, 0, 0, 0}
end
local now = now_ms()
local batch = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', 0, batch)
local lease = tonumber(ARGV[3])
if lease > 0 and #due < batch then
  -- Held in doubt past their hold deadline: only the order lookup settles them.
  for _, jti in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], HELD, HELD, 'LIMIT', 0,
      batch - #due)) do
    local rec = decode(redis.call('HGET', KEYS[2], jti))
    if rec and rec.state == 'pending' and tonumber(rec.deadline) <= now then
      due[#due + 1] = jti
    end
  end
end
local give_up = tonumber(ARGV[4])
local k = {res = KEYS[2], users = KEYS[3], stock = KEYS[4], ledger = KEYS[5], pending = KEYS[1],
  events = KEYS[6], maxlen = ARGV[2]}
local released, units, retired = 0, 0, 0
local handed = {}
for _, jti in ipairs(due) do
  local rec = decode(redis.call('HGET', KEYS[2], jti))
  if not rec or rec.state ~= 'pending' then
    redis.call('ZREM', KEYS[1], jti)
  elseif lease > 0 and (give_up == 0 or tonumber(rec.deadline) + give_up > now
      or flagged(rec, 'd')) then
    rec.fence = int(tonumber(rec.fence) + 1)
    redis.call('HSET', KEYS[2], jti, encode(rec))
    redis.call('ZADD', KEYS[1], 'XX', int(now + lease), jti)
    handed[#handed + 1] = jti
    handed[#handed + 1] = rec.fence
  elseif flagged(rec, 'd') then
    -- Held in doubt: never released by its hold's expiry.
    redis.call('ZADD', KEYS[1], 'XX', HELD, jti)
  elseif lease == 0 and tonumber(rec.deadline) > now then
    -- Made due early for an order lookup this instance does not make (another instance's
    -- configuration): it expires at its hold deadline, not before.
    redis.call('ZADD', KEYS[1], 'XX', rec.deadline, jti)
  else
    if give_back(k, jti, rec, int(now), 'expired') < 0 then
      retired = retired + 1
    end
    released = released + 1
    units = units + tonumber(rec.qty)
  end
end
local out = {released, units, #due, retired}
for _, v in ipairs(handed) do
  out[#out + 1] = v
end
return out
