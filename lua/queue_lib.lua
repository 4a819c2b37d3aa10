-- flashgate waiting room, shared by the queue scripts (prepended after lib.lua).
--
-- The queue of one activity lives on its base tag: <p>:{<id>}:q, a hash, and <p>:{<id>}:q:tickets
-- (user id -> ticket number). Fields of the hash:
--   seq      the last ticket number issued (one per user; numbers skip the places a cursor
--            that ran past everyone passed)
--   start    when the cursor starts (unix ms): the sale's start, or a later one it was postponed
--            to (or an earlier one a reload moved it to before it opened); the cursor stands at
--            base before it
--   superseded  the latest start a reload moved earlier (unix ms): gateways not reloading
--            postpone only past it (queue_reschedule)
--   rate     places admitted per second, for the whole fleet
--   base, t0 the cursor: base + (now - t0) * rate / 1000 places while running (times in ms, by
--            Redis's clock), base while paused or held, or before start
--   paused   1 while an operator paused it
--   halted   since when the activity is halted (unix ms; 0 or absent: not halted; lua/halt.lua;
--            every state read follows the halt key): the cursor stands as paused, kept apart
--            from the operator's pause so that lifting one never lifts the other; replies report
--            paused while either holds. Its resume is marked like a postponement (from the halt
--            to the resume): the admission windows open at the halt run on after it with what
--            they had left, since nobody could buy meanwhile
--   held     1 while nothing is left to sell (the cursor waits for units to come back)
--   drawn    the tickets issued before the start (their places are drawn at the start), once
--            the start has passed
--   seed     the draw's seed (64 hex digits: 32 bytes; an older flashgate's: a decimal number),
--            chosen when the queue is set up, never changed after; see src/waiting/draw.rs
--   commit   hex(sha256(the seed's 32 bytes)), written with the seed (published from opens_at)
--   epoch    a random id written when the queue was set up: tickets carry it, so a ticket of a
--            queue Redis lost holds no place in the one set up again
--   hist     the cursor's recent history, for when each place was reached (its admission
--            window runs from then): up to HIST_MAX marks "t,c,r,run[,p]" (from time t the cursor
--            was at c, moving at r places a second if run is 1; p: the sale was postponed at p,
--            the cursor standing from p to t), oldest first, ';'-separated
--   lapsed   every place up to this one has lapsed (set when old marks are dropped)
--   log      every mark hist ever had, in the same form, oldest first (up to LOG_MAX: the oldest
--            are dropped beyond it): when each place was reached, for `flashgate report`;
--            written only with a mark (a start, a change of rate, a pause, a hold, a resume)
--   solved   proof-of-work challenges solved (a solution spent with a ticket ask), for the report
--   a:<n>    when a ticket call issued numbers n.. (unix ms; up to the next a: field's number):
--            one field a call that issued any, for `flashgate report` (the hash grows with
--            the calls: read it by field, HMGET, or HSCAN MATCH a:*)
--   step     1 once the queue runs stepped (queue_step below: skip_absent_after_secs or
--            max_active configured): the cursor is then `base`, moved only by queue_step
--   tc, credit  stepped: when admission credit was last accrued (ms), and the credit (in
--            thousandths of a place: exact integers)
--   seenat   stepped: every place counts as seen at this time at least (ms): when the queue
--            turned stepped (a ticket issued under the time-function cursor has no poll
--            recorded) and when a halt was lifted (a halt refuses purchase attempts before the
--            waiting room records them). Once stepped, a queue stays stepped: a reload removing
--            both keys keeps it walking, with no absence check and no limit (queue_state.lua)
--   active   stepped: admitted places not bought nor lapsed, as of the last step
-- Stepped, three more keys on the tag: <q>:seen (place -> last poll, ms), <q>:adm (place ->
-- when it was admitted, ms, or 's' when its turn was given away), <q>:active (ZSET place ->
-- when admitted: admitted, not bought, not lapsed).
-- A ticket's place: its number, or for a ticket drawn at the start its drawn place (1..drawn).
-- Place p is admitted once the cursor reaches p.

local HIST_MAX = 16
local LOG_MAX = 4096

local function queue_state(q)
  local f = redis.call('HMGET', q, 'seq', 'start', 'rate', 'base', 't0', 'paused', 'held',
    'drawn', 'seed', 'epoch', 'hist', 'lapsed', 'halted', 'commit', 'step', 'active')
  return {seq = tonumber(f[1] or '0'), start = tonumber(f[2] or '0'), rate = tonumber(f[3] or '1'),
    base = tonumber(f[4] or '0'), t0 = tonumber(f[5] or '0'), paused = f[6] == '1',
    held = f[7] == '1', drawn = f[8], seed = f[9], epoch = f[10] or '0', hist = f[11] or '',
    lapsed = tonumber(f[12] or '0'), halted = (f[13] or '0') ~= '0',
    halted_at = tonumber(f[13] or '0'), commit = f[14], stepped = f[15] == '1',
    active = tonumber(f[16] or '0')}
end

local function queue_running(s)
  return not (s.paused or s.held or s.halted)
end

-- Records where the cursor is from s.t0 on (after a start, a change of rate, a pause, a
-- resume, a hold). Marks every place of a dropped mark lapsed, so that no place's window ever
-- starts later than it did (a lapsed ticket stays lapsed).
local function queue_mark(q, s, postponed_at)
  local marks = {}
  for m in string.gmatch(s.hist, '[^;]+') do
    marks[#marks + 1] = m
  end
  -- A mark the cursor did not move on from (the next one is at the same place) decides no
  -- place's reach time: replaced, so a hold flapping near sell-out, a pause and resume, a rate
  -- changed twice cost one mark. A postponement's mark is kept (it lengthens windows).
  local last = marks[#marks]
  local replaced = false
  if last and not postponed_at then
    local c = string.match(last, '^[^,]+,([^,]+),[^,]+,[01]$')
    if c and tonumber(c) == s.base then
      marks[#marks] = nil
      replaced = true
    end
  end
  local mark = int(s.t0) .. ',' .. int(s.base) .. ',' .. int(s.rate) .. ',' ..
    (queue_running(s) and '1' or '0')
  if postponed_at then
    -- The cursor stood from postponed_at to t0: windows still open then run on after it.
    mark = mark .. ',' .. int(postponed_at)
  end
  marks[#marks + 1] = mark
  while #marks > HIST_MAX do
    table.remove(marks, 1)
    local c = tonumber(string.match(marks[1], '^[^,]+,([^,]+),'))
    if c > s.lapsed then
      s.lapsed = c
    end
  end
  s.hist = table.concat(marks, ';')
  -- The log keeps every mark (its last one may be replaced above, as in hist: a mark the cursor
  -- did not move on from decides no place's reach time, in either).
  local log = redis.call('HGET', q, 'log') or ''
  local kept = {}
  for m in string.gmatch(log, '[^;]+') do
    kept[#kept + 1] = m
  end
  if replaced and kept[#kept] == last then
    kept[#kept] = nil
  end
  kept[#kept + 1] = mark
  while #kept > LOG_MAX do
    table.remove(kept, 1)
  end
  redis.call('HSET', q, 'hist', s.hist, 'lapsed', int(s.lapsed), 'log', table.concat(kept, ';'))
end

-- The cursor runs from the start, or from now for a queue set up after it.
local function queue_init(q, tickets, rate, start, now, epoch)
  if redis.call('HSETNX', q, 'start', start) == 1 then
    -- Tickets of a lost queue say nothing about this one.
    redis.call('DEL', tickets)
    local t0 = math.max(now, tonumber(start))
    redis.call('HSET', q, 'rate', rate, 'base', 0, 't0', int(t0), 'seq', 0, 'epoch', epoch,
      'hist', int(t0) .. ',0,' .. rate .. ',1', 'lapsed', 0, 'log', int(t0) .. ',0,' .. rate .. ',1')
  end
end

local function queue_cursor(s, now)
  if s.stepped then
    return s.base
  end
  if now < s.start or now < s.t0 or not queue_running(s) then
    return s.base
  end
  return s.base + math.floor((now - s.t0) * s.rate / 1000)
end

-- Restarts the cursor from where it is now (before a change of rate, pause or hold; the caller
-- then records the change with queue_mark).
local function queue_rebase(q, s, now)
  s.base = queue_cursor(s, now)
  s.t0 = math.max(now, s.start)
  redis.call('HSET', q, 'base', int(s.base), 't0', int(s.t0))
end

-- A halt lengthens the stepped admission windows open at it by its length: the buyers were told
-- `unavailable` (retry) meanwhile, and retry into what was left of their window. Their admission
-- times move later by the halt's length, in `adm` (what a poll is told) and `active` (what
-- lapses) alike. As on the time-function cursor (src/waiting/view.rs, `window_ends_at`), only
-- a window with more than HALT_MARGIN_MS left at the halt is lengthened: a gateway's view may
-- be that old when the halt comes, so one with less left may have been told `expired` already
-- (a lapsed ticket stays lapsed), and lapses on its own time (queue_step). The window is the
-- one queue_step last recorded (none yet: nothing admitted). A halt time of the old format
-- ('1', before a halt kept its time) says nothing of when it began: nothing is lengthened.
-- k: {adm, active}. O(windows open at the halt): one ZADD and one HSET each, in the resume's
-- script call (200,000 open windows took Redis 0.9 s; max_active bounds them).
local HALT_MARGIN_MS = 500 -- two of a gateway's state reads (waiting::REFRESH_INTERVAL)
local HALT_KEPT_TIME = 1000000000000 -- a halt time below this is of the old format ('1')
local function queue_lengthen(q, k, halted_at, now)
  local window = tonumber(redis.call('HGET', q, 'window') or '')
  if not window or not halted_at or halted_at < HALT_KEPT_TIME or now <= halted_at then
    return
  end
  local d = now - halted_at
  local open = redis.call('ZRANGEBYSCORE', k[2], '(' .. int(halted_at + HALT_MARGIN_MS - window),
    '+inf', 'WITHSCORES')
  for i = 1, #open, 2 do
    local at = int(tonumber(open[i + 1]) + d)
    redis.call('ZADD', k[2], at, open[i])
    redis.call('HSET', k[1], open[i], at)
  end
end

-- Sets one of the flags that stand the cursor (`held`: nothing left to sell; `halted`: the
-- activity is halted), restarting the cursor from where it stood when it changes (recorded like
-- a pause: no place is skipped or admitted twice). `stepped_keys` ({adm, active}): a stepped
-- queue's resume lengthens the windows open at the halt (queue_lengthen).
local function queue_stand(q, s, flag, on, now, stepped_keys)
  if on ~= s[flag] then
    queue_rebase(q, s, now)
    s[flag] = on
    local value, stood_from = on and '1' or '0', nil
    if flag == 'halted' then
      -- A halt keeps its time; its resume is marked as a postponement from it.
      stood_from = (not on) and s.halted_at or nil
      s.halted_at = on and now or 0
      value = int(s.halted_at)
    end
    redis.call('HSET', q, flag, value)
    if flag == 'halted' and not on and s.stepped then
      redis.call('HSET', q, 'seenat', int(now))
      if stepped_keys then
        queue_lengthen(q, stepped_keys, stood_from, now)
      end
    end
    queue_mark(q, s, stood_from)
  end
end

-- A sale postponed (a reload, or a restart with a newer file): the cursor stands where it is
-- until the later start. A later start already past when it arrives stands the cursor not at
-- all (no jump either).
-- Earlier only when `moved` (a gateway's reload moved it: an operator's act) and the queue has
-- not opened (no ticket issued, so nobody was told a time; not drawn; its start not reached);
-- the start it replaces is kept in `superseded`,
-- and a caller that is not reloading postpones only past it: a gateway still on the older file
-- (or restarted with it) cannot move the start back. Approximation: a restart (not a reload)
-- with a file that postpones to a time at or before a superseded start postpones nothing.
local function queue_reschedule(q, s, start, now, mode)
  -- mode '1': this gateway's reload moved the start; '2': a reload applied it unchanged here
  -- (earlier only, as '1'; later only past `superseded`, as any caller); '0': no reload.
  local moved = mode == '1'
  local earlier = moved or mode == '2'
  local want = tonumber(start)
  local superseded = tonumber(redis.call('HGET', q, 'superseded') or '0')
  if want > s.start and (moved or want > superseded) then
    -- The sale had started (drawn at its first call at or after a start), or starts now.
    local running_before = s.drawn ~= nil or now >= s.start
    s.base = queue_cursor(s, now)
    s.start = want
    s.t0 = math.max(want, now)
    redis.call('HSET', q, 'start', int(want), 't0', int(s.t0), 'base', int(s.base))
    queue_mark(q, s, (running_before and s.t0 > now) and now or nil)
  elseif earlier and want < s.start and s.seq == 0 and not s.drawn and now < s.start then
    redis.call('HSET', q, 'superseded', int(math.max(superseded, s.start)))
    s.start = want
    s.t0 = math.max(want, now)
    redis.call('HSET', q, 'start', int(want), 't0', int(s.t0))
    queue_mark(q, s)
  end
end

-- The draw's seed and its commitment, chosen once: when the queue is set up (queue_init calls
-- this), or for a queue an older flashgate set up, at the first call before its draw. Never
-- changed once written (a drawn queue without a commitment keeps its seed: nothing was
-- promised for it).
local function queue_commit(q, s, seed, commit)
  if not s.commit and not s.drawn then
    s.seed, s.commit = seed, commit
    redis.call('HSET', q, 'seed', seed, 'commit', commit)
  end
end

-- At the first call at or after the start: the tickets issued so far are drawn (with the seed
-- committed to).
local function queue_freeze(q, s, now)
  if now >= s.start and not s.drawn then
    s.drawn = tostring(s.seq)
    redis.call('HSET', q, 'drawn', s.drawn)
  end
end

local function queue_reply(s, now, extra)
  local out = {int(s.seq), int(s.start), int(s.rate), int(s.base), int(s.t0),
    (s.paused or s.halted) and '1' or '0', s.held and '1' or '0', s.drawn or '', s.seed or '', int(now),
    s.epoch, s.hist, int(s.lapsed), s.commit or '', int(s.halted and s.halted_at or 0),
    s.stepped and '1' or '0', int(s.active)}
  for _, v in ipairs(extra or {}) do
    out[#out + 1] = v
  end
  return out
end

-- Most places one stepped call walks (admitted or skipped): O(1) per call.
local STEP_MAX = 512

-- The stepped admission (called by queue_state.lua, every gateway every 250 ms): credit accrues
-- at the rate by Redis's clock while the cursor runs (at most one second's worth is kept, and
-- less than one place once nobody is left to admit or max_active holds, so a queue that ran
-- empty or stood at max_active admits no burst after); admitted places
-- lapse out of `active` exactly `window_ms` after their admission; then the cursor walks
-- forward over issued places, giving away the turn of a place whose ticket was not polled for
-- `skip_ms` (0: never), admitting the others (one credit each, recorded with their time) until
-- the credit is spent, `max_active` (0: none) admitted buyers are active, everyone issued is
-- decided, or STEP_MAX places were walked. The cursor only moves forward, each place is decided
-- once (admitted or skipped), and `active` never passes max_active.
-- A pre-queue place (drawn at the start) not polled since the draw counts as seen at the start
-- (queue_ticket.lua records no poll for a pre-queue ticket: its number is not its place);
-- every place counts as seen at `seenat` (when the queue turned stepped: a reload added a key
-- mid-sale, and the time-function cursor records no polls; when a halt was lifted: it refused
-- purchase attempts unrecorded). Approximation: a buyer asked then to come back later than
-- skip_ms (the time cursor's refresh, up to 30 s) is skipped if the walk reaches them first.
-- k: {seen, adm, active}.
local function queue_step(q, s, k, now, skip_ms, max_active, window_ms, expire_at)
  if not s.stepped then
    -- From here on the cursor is `base`: it stands where the time function had it.
    s.base = queue_cursor(s, now)
    s.stepped = true
    redis.call('HSET', q, 'step', '1', 'base', int(s.base), 'tc', int(now), 'credit', 0,
      'seenat', int(now))
  end
  local f = redis.call('HMGET', q, 'tc', 'credit', 'seenat')
  local tc, credit, seenat = tonumber(f[1] or now), tonumber(f[2] or '0'), tonumber(f[3] or '')
  -- While halted no window with more than HALT_MARGIN_MS left at the halt runs out (the resume
  -- lengthens them by the halt, queue_lengthen); one with less lapses on its own time.
  local lapse_now = now
  if s.halted and s.halted_at >= HALT_KEPT_TIME then
    lapse_now = math.min(now, s.halted_at + HALT_MARGIN_MS)
  end
  redis.call('ZREMRANGEBYSCORE', k[3], '-inf', '(' .. int(lapse_now - window_ms))
  local active = redis.call('ZCARD', k[3])
  local cur = s.base
  if queue_running(s) and s.drawn and now >= s.start then
    local from = math.max(tc, s.start)
    if now > from then
      credit = math.min(credit + (now - from) * s.rate, math.max(s.rate, 1) * 1000)
    end
    local drawn, steps = tonumber(s.drawn), 0
    while steps < STEP_MAX and credit >= 1000 and cur < s.seq
      and (max_active == 0 or active < max_active) do
      local p = cur + 1
      local seen = tonumber(redis.call('HGET', k[1], int(p)) or '')
      if p <= drawn and (not seen or seen < s.start) then
        -- Drawn at the start: a poll before it is not recorded (nor is the place known then).
        seen = s.start
      end
      if seenat and (not seen or seenat > seen) then
        seen = seenat
      end
      if skip_ms == 0 or (seen and now - seen <= skip_ms) then
        redis.call('HSET', k[2], int(p), int(now))
        redis.call('ZADD', k[3], int(now), int(p))
        active = active + 1
        credit = credit - 1000
      else
        redis.call('HSET', k[2], int(p), 's')
      end
      cur = p
      steps = steps + 1
    end
    if cur >= s.seq or (max_active > 0 and active >= max_active) then
      -- Nobody to admit: the unused credit is not banked (less than a place is kept), so
      -- newcomers, or places freed later, are admitted at the rate, not in a burst.
      credit = credit % 1000
    end
  end
  s.base = cur
  s.t0 = now
  s.active = active
  redis.call('HSET', q, 'base', int(cur), 't0', int(now), 'tc', int(now), 'credit', int(credit),
    'active', int(active), 'window', int(window_ms))
  for _, key in ipairs(k) do
    extend(key, expire_at)
  end
end
