-- flashgate release: give a reservation's units back, atomically and exactly once.
-- (lib.lua is prepended: give_back.)
--
-- KEYS[1] res   KEYS[2] users   KEYS[3] stock of the version   KEYS[4] ledger of the version
-- KEYS[5] pending of the version   KEYS[6] events   KEYS[7] the segment's master record
-- KEYS[8] known (see lua/master.lua)
-- ARGV[1] jti   ARGV[2] version the caller believes it belongs to   ARGV[3] reason
-- ARGV[4] who asks:
--   owner    the request that made the reservation failed: only from pending, and not once an
--            idempotent replay handed it to another request
--   abandon  the request that sent the reserve does not know whether it landed: as owner, and an
--            unknown id gets a released tombstone, so that the reserve can never land later
--   lookup   the backend said it holds no such order: only from pending, only if the record's
--            fence is still ARGV[6], the one the sweep's hand-out set (no replay was forwarded,
--            and no later hand-out made, since the question was asked), and only once its hold
--            deadline passed: before it, the token (whose exp is at most the deadline) is still
--            valid, so a backend slower than the gateway's timeouts may still take the order;
--            the answer is then kept for later (due again at the deadline)
--   admin    the backend or an operator cancels: from pending or confirmed
-- ARGV[5] stream cap   ARGV[6] the fence (lookup only)
-- ARGV[7] the master identity the gateway last saw accepted here ('' none)   ARGV[8] the most
-- records it saw the segment hold   ARGV[9] of which life: the gateway's fencing token. An
-- abandon writes no tombstone into a segment fenced, lost or gone back for it: a tombstone
-- grows the records hash, and a store back to an older snapshot would then hold as many
-- records as the gateway saw and pass for whole (8 units of a 6-unit stock sold). The reserve it would stop is refused there by the same token.
-- ARGV[10] the newest version of a sale the gateway acknowledged in that life (the token's
-- last part; absent: any): in a newer life the gateway did not see begin, the tombstone is held
-- back only for a version it sold there, which the reserve refuses too (lua/reserve.lua); a
-- newer version's reserve is taken there, so its abandon's tombstone is written (else the late
-- reserve takes a unit no request forwards, held until its hold runs out).
--
-- Returns {code, remaining}:
--   1 released; remaining in its version, -1 if its units were retired
--   0 already released (nothing changes: exactly once)
--  -1 unknown reservation
--  -2 version mismatch (nothing changes)
--  -3 kept: confirmed, and only admin gives back a confirmed sale
--  -4 kept: a replay handed it to another request
--  -5 kept: fenced (the lookup's answer is older than a forward or hand-out since)
--  -6 kept: a lookup's "not found" before the hold deadline (due again at the deadline)

local jti, mode = ARGV[1], ARGV[4]
local raw = redis.call('HGET', KEYS[1], jti)
if not raw then
  local records, life = records_of(KEYS[1])
  if mode == 'abandon' and master_holds(KEYS[7], ARGV[7])
      and not went_back(records, life, tonumber(ARGV[8]), ARGV[9])
      and not (tonumber(ARGV[2]) <= (tonumber(ARGV[10] or '') or math.huge)
        and renewed_unseen(life, ARGV[9], KEYS[8])) then
    redis.call('HSET', KEYS[1], jti, encode({state = 'released', qty = '0', ver = ARGV[2],
      created = '', deadline = '', done = int(now_ms()), reason = ARGV[3], flags = 't',
      fence = '0', prior = '0', busy = '0', user = ''}))
    -- Into a segment never prewarmed, the tombstone makes the hash: give it an expiry (it
    -- only has to outlive the reserve it stops; prewarm extends it with the rest).
    if redis.call('TTL', KEYS[1]) == -1 then
      redis.call('EXPIRE', KEYS[1], ABANDONED_TTL_SECS)
    end
  end
  return {-1, -1}
end
local rec = decode(raw)
if not rec then
  return redis.error_reply('unreadable reservation record ' .. jti)
end
if rec.state == 'released' then
  return {0, -1}
end
if rec.ver ~= ARGV[2] then
  return {-2, -1}
end
if rec.state == 'confirmed' and mode ~= 'admin' then
  return {-3, -1}
end
if flagged(rec, 'r') and (mode == 'owner' or mode == 'abandon') then
  return {-4, -1}
end
if mode == 'lookup' and rec.fence ~= ARGV[6] then
  return {-5, -1}
end
local now = now_ms()
if mode == 'lookup' and tonumber(rec.deadline) > now then
  redis.call('ZADD', KEYS[5], 'XX', int(math.max(tonumber(rec.deadline), tonumber(rec.busy))),
    jti)
  return {-6, -1}
end
local k = {res = KEYS[1], users = KEYS[2], stock = KEYS[3], ledger = KEYS[4], pending = KEYS[5],
  events = KEYS[6], maxlen = ARGV[5]}
return {1, give_back(k, jti, rec, int(now), ARGV[3])}
