//! An in-process stock store for unit tests: one `Mutex` over maps, following the documented
//! semantics of each script (`lua/*.lua`) closely enough for the callers' own logic (the
//! lifecycle and its sweep, segments' pulls) to be tested in microseconds without Redis. The
//! scripts themselves are proven against a real Redis (tests/scripts.rs, tests/model.rs, e2e);
//! this is not a second implementation to trust for stock.
//!
//! Kept: states only move forward; a release never of a reservation the caller may not release
//! (owner/abandon refused once replayed, lookup only under its fence and past the deadline,
//! confirmed only by admin); exactly once (a second release or confirm changes nothing);
//! tombstones of abandoned ids; the fence moved by each forward and hand-out; the due times the
//! sweep reads; transfers given, received and acknowledged; the ledger identity
//! `initial + moved_in - moved_out == remaining + pending + confirmed + retired`
//! ([`FakeStore::check_ledgers`]).
//!
//! Approximations: no event stream, key expiry, damaged keys or placeholders; a late acceptance
//! is covered from the version's stock only (the script may also cover it from retired units),
//! else counted oversold. Redis's clock is [`EPOCH_MS`] plus tokio's clock since the fake was
//! made, so `tokio::time::pause` and `advance` move it and nothing else does.

use super::{
    Deposit, Layout, LedgerRow, RecordState, ReleaseReason, ReservationRecord, ReserveCall,
    ReserveOutcome, Segment, SegmentMeta, StoreError, Transfer,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::Duration;

/// Redis's clock when a fake is made (unix ms).
pub const EPOCH_MS: u64 = 1_800_000_000_000;

/// One reservation record (see `lua/lib.lua`).
#[derive(Debug, Clone)]
struct Rec {
    record: ReservationRecord,
    prior: u64,
    busy: u64,
}

/// One segment's keys.
#[derive(Debug, Default)]
struct Part {
    meta: SegmentMeta,
    /// Stock keys: version -> units left.
    stock: BTreeMap<u64, i64>,
    ledgers: BTreeMap<u64, LedgerRow>,
    records: BTreeMap<String, Rec>,
    /// Pending sets: version -> id -> when due (ms).
    due: BTreeMap<u64, BTreeMap<String, u64>>,
    users: BTreeMap<String, u64>,
    idem: BTreeMap<String, String>,
    transfers: BTreeMap<String, Transfer>,
    acknowledged: BTreeMap<String, Transfer>,
    received: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct State {
    parts: BTreeMap<String, Part>,
    /// Base metas by activity id (segment count, newest version, segments made).
    bases: BTreeMap<String, SegmentMeta>,
    registry: BTreeMap<String, u32>,
    published: Vec<(String, String)>,
    /// By operation name: calls to let through, then calls to fail.
    failing: BTreeMap<&'static str, (u32, u32)>,
    /// Ids per confirm call, in call order.
    confirm_calls: Vec<usize>,
    /// Prewarms asked for, and what the claim answers them (`None`: on sale).
    prewarms: u32,
    refusal: Option<super::segments::Refusal>,
}

/// The fake store.
#[derive(Debug)]
pub struct FakeStore {
    state: Mutex<State>,
    started: tokio::time::Instant,
}

impl Default for FakeStore {
    fn default() -> Self {
        FakeStore {
            state: Mutex::default(),
            started: tokio::time::Instant::now(),
        }
    }
}

fn empty_row(version: u64) -> LedgerRow {
    LedgerRow {
        version,
        stock_key: false,
        remaining: 0,
        initial: 0,
        pending: 0,
        confirmed: 0,
        released: 0,
        retired: 0,
        moved_in: 0,
        moved_out: 0,
        unsold_retired: 0,
        late_accepted: 0,
        oversold: 0,
        restocked: 0,
        recounted: 0,
        held_in_doubt: 0,
        ledger: false,
        pending_reservations: 0,
    }
}

impl FakeStore {
    /// Redis's clock now (unix ms).
    pub fn now_ms(&self) -> u64 {
        EPOCH_MS + self.started.elapsed().as_millis() as u64
    }

    /// The next `calls` calls of `op` (a trait method's name) fail as a timeout would.
    pub fn fail(&self, op: &'static str, calls: u32) {
        self.fail_later(op, 0, calls);
    }

    /// The same after `skip` calls of `op` that answer.
    pub fn fail_later(&self, op: &'static str, skip: u32, calls: u32) {
        self.state.lock().failing.insert(op, (skip, calls));
    }

    /// Prewarms refused with `refusal` from now on (what Redis recorded disagrees).
    pub fn refuse(&self, refusal: super::segments::Refusal) {
        self.state.lock().refusal = Some(refusal);
    }

    /// Another instance's claim recorded `version` as the activity's newest.
    pub fn claimed(&self, id: &str, version: u64) {
        self.state
            .lock()
            .bases
            .entry(id.to_owned())
            .or_default()
            .newest = Some(version);
    }

    /// Ids each confirm call carried, in call order.
    pub fn confirm_calls(&self) -> Vec<usize> {
        self.state.lock().confirm_calls.clone()
    }

    /// Prewarms asked for so far.
    pub fn prewarms(&self) -> u32 {
        self.state.lock().prewarms
    }

    /// Messages published so far.
    pub fn published(&self) -> Vec<String> {
        self.state
            .lock()
            .published
            .iter()
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Locks the state, failing the call if the test asked for it.
    fn enter(&self, op: &'static str) -> Result<parking_lot::MutexGuard<'_, State>, StoreError> {
        let mut state = self.state.lock();
        match state.failing.get_mut(op) {
            Some((skip, _)) if *skip > 0 => *skip -= 1,
            Some((_, left)) if *left > 0 => {
                *left -= 1;
                return Err(StoreError::Timeout(Duration::from_millis(1)));
            }
            _ => {}
        }
        Ok(state)
    }

    /// Puts `version` on sale with `stock` units split over the layout's segments (what
    /// prewarm and the claim leave behind), retiring the version before it.
    pub fn on_sale(&self, layout: &Layout, version: u64, stock: u64) {
        let mut state = self.state.lock();
        for segment in layout.segments() {
            let units = layout.share(stock, segment.index()) as i64;
            let part = state.parts.entry(segment.tag()).or_default();
            if let Some(old) = part.meta.current.filter(|&c| c != version) {
                retire(part, old);
            }
            part.meta.current = Some(version);
            if !part.meta.versions.contains(&version) {
                part.meta.versions.push(version);
                part.stock.insert(version, units);
                let row = part.ledgers.entry(version).or_insert(empty_row(version));
                row.initial = units;
                row.ledger = true;
            }
        }
        let base = state.bases.entry(layout.id().to_string()).or_default();
        base.segments = Some(layout.count());
        base.newest = Some(version);
        base.made = (0..layout.count()).collect();
        state
            .registry
            .insert(layout.id().to_string(), layout.count());
    }

    /// A newer version went on sale: `version`'s stock key in `segment` is gone and its
    /// units left are retired (what prewarm does to the version before).
    pub fn retire(&self, segment: Segment<'_>, version: u64) {
        let mut state = self.state.lock();
        retire(state.parts.entry(segment.tag()).or_default(), version);
    }

    /// Units left in `version` of `segment`, if its stock key exists.
    pub fn stock(&self, segment: Segment<'_>, version: u64) -> Option<i64> {
        let state = self.state.lock();
        state
            .parts
            .get(&segment.tag())?
            .stock
            .get(&version)
            .copied()
    }

    /// The units `user` holds in a segment (see [`StockStore::units_held`]).
    pub fn units_held(&self, segment: Segment<'_>, user: &str) -> u64 {
        let state = self.state.lock();
        state
            .parts
            .get(&segment.tag())
            .and_then(|p| p.users.get(user).copied())
            .unwrap_or(0)
    }

    /// When a pending reservation is due for the sweep (ms), if it is in the pending set.
    pub fn due_at(&self, segment: Segment<'_>, version: u64, id: &str) -> Option<u64> {
        let state = self.state.lock();
        let part = state.parts.get(&segment.tag())?;
        part.due.get(&version)?.get(id).copied()
    }

    /// Records a transfer `giver` gave at `at_ms` that never arrived (a gateway died between
    /// the withdraw and the deposit): the withdraw script's half alone.
    pub fn withdrawn(&self, giver: Segment<'_>, version: u64, id: &str, to: u32, qty: u64) {
        let now = self.now_ms();
        let mut state = self.state.lock();
        let part = state.parts.entry(giver.tag()).or_default();
        *part.stock.get_mut(&version).expect("on sale") -= qty as i64;
        part.ledgers.get_mut(&version).expect("ledger").moved_out += qty as i64;
        let transfer = Transfer {
            id: id.to_owned(),
            version,
            to,
            qty,
            at_ms: now,
        };
        part.transfers.insert(id.to_owned(), transfer);
    }

    /// Units vanish from `version`'s stock in `segment` without a ledger entry (a key edited
    /// by hand): the drift the ledger check reports.
    pub fn lose(&self, segment: Segment<'_>, version: u64, units: i64) {
        let mut state = self.state.lock();
        let part = state.parts.entry(segment.tag()).or_default();
        *part.stock.get_mut(&version).expect("on sale") -= units;
    }

    /// Every segment's ledger identity holds, and its pending count is its pending records'.
    pub fn check_ledgers(&self) {
        let state = self.state.lock();
        for (tag, part) in &state.parts {
            for (version, row) in &part.ledgers {
                let left = part.stock.get(version).copied().unwrap_or(0);
                assert_eq!(
                    row.initial + row.moved_in - row.moved_out,
                    left + row.pending + row.confirmed + row.retired,
                    "ledger of {tag} v{version}: {row:?}, {left} left"
                );
                let pending: u64 = part
                    .records
                    .values()
                    .filter(|r| r.record.ver == *version && r.record.state == RecordState::Pending)
                    .map(|r| r.record.qty)
                    .sum();
                assert_eq!(row.pending, pending as i64, "pending of {tag} v{version}");
            }
        }
    }

    /// One unit of `version` reserved by `user` as reservation `id`, without a key, at any hour
    /// (for tests that need a buyer holding stock, not the reserve's details).
    pub fn reserve_one(
        &self,
        segment: Segment<'_>,
        user: &str,
        version: u64,
        id: &str,
    ) -> ReserveOutcome {
        let call = ReserveCall {
            user,
            qty: 1,
            per_user_limit: 1,
            version,
            reservation_id: id,
            hold: Duration::from_secs(60),
            idempotency_key: None,
            deposit: None,
            in_flight: Duration::from_secs(1),
            replay_only: false,
            hours: super::SaleHours::ALWAYS,
            steps: None,
            line: false,
        };
        self.reserve_now(segment, &call)
    }

    /// The reserve script (`lua/reserve.lua`), less its damaged-key checks.
    pub fn reserve_now(&self, segment: Segment<'_>, call: &ReserveCall<'_>) -> ReserveOutcome {
        let now = self.now_ms();
        let mut state = self.state.lock();
        let part = state.parts.entry(segment.tag()).or_default();
        let idem = call.idempotency_key.map(|k| format!("{}\n{k}", call.user));
        match judge(part, call, idem.as_deref(), now) {
            Ok(stock) => take(part, call, idem, now, stock),
            Err(outcome) => outcome,
        }
    }

    /// The withdraw script (`lua/withdraw.lua`): up to `want` units out, once per transfer id.
    pub fn withdraw_now(
        &self,
        giver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        want: u64,
        to: u32,
    ) -> u64 {
        let now = self.now_ms();
        let mut state = self.state.lock();
        let part = state.parts.entry(giver.tag()).or_default();
        if let Some(seen) = part
            .transfers
            .get(transfer_id)
            .or(part.acknowledged.get(transfer_id))
        {
            return seen.qty;
        }
        let stock = part.stock.get(&version).copied().unwrap_or(0);
        let take = (stock.max(0) as u64).min(want);
        if take == 0 {
            return 0;
        }
        part.stock.insert(version, stock - take as i64);
        part.ledgers.get_mut(&version).expect("ledger").moved_out += take as i64;
        let transfer = Transfer {
            id: transfer_id.to_owned(),
            version,
            to,
            qty: take,
            at_ms: now,
        };
        part.transfers.insert(transfer_id.to_owned(), transfer);
        take
    }
}

/// The reserve script's judgement of one purchase, in its order (a deposit first, a replay,
/// the stock, the buyer's limit, the sale's hours, the id): the version's stock when it may take
/// it, else the answer.
fn judge(
    part: &mut Part,
    call: &ReserveCall<'_>,
    idem: Option<&str>,
    now: u64,
) -> Result<i64, ReserveOutcome> {
    if part.meta.versions.is_empty() && part.stock.is_empty() {
        return Err(ReserveOutcome::NoStockKey);
    }
    if let Some((id, units)) = call.deposit {
        if deposit(part, call.version, id, units) == Deposit::Refused {
            return Err(ReserveOutcome::DepositRefused { damaged: false });
        }
    }
    if let Some(outcome) = idem.and_then(|f| replay(part, f, call, now)) {
        return Err(outcome);
    }
    if call.replay_only {
        return Err(ReserveOutcome::NotReplayed);
    }
    let Some(&stock) = part.stock.get(&call.version) else {
        return Err(ReserveOutcome::NoStockKey);
    };
    let held = part.users.get(call.user).copied().unwrap_or(0);
    let qty = u64::from(call.qty);
    let mut limit = call.per_user_limit;
    if let Some(steps) = call.steps {
        // The buyer's phase by the store's clock: its limit, and nothing before the first.
        match steps.at(now as i64) {
            Some((step_limit, _)) => limit = step_limit,
            None => return Err(ReserveOutcome::NotStarted),
        }
    }
    if held + qty > u64::from(limit) {
        return Err(ReserveOutcome::LimitExceeded { held });
    }
    if stock < qty as i64 {
        return Err(ReserveOutcome::Insufficient {
            remaining: stock as u64,
        });
    }
    if (now as i64) < call.hours.opens_ms {
        return Err(ReserveOutcome::NotStarted);
    }
    if (now as i64) >= call.hours.closes_ms {
        return Err(ReserveOutcome::Ended);
    }
    if part.records.contains_key(call.reservation_id) {
        return Err(ReserveOutcome::DuplicateId);
    }
    Ok(stock)
}

/// A new reservation taken from `stock` (judged above): its record, the stock, the buyer's
/// units, the ledger's pending, its due time and its idempotency key.
fn take(
    part: &mut Part,
    call: &ReserveCall<'_>,
    idem: Option<String>,
    now: u64,
    stock: i64,
) -> ReserveOutcome {
    let qty = u64::from(call.qty);
    let deadline = now + call.hold.as_millis() as u64;
    let busy = now + call.in_flight.as_millis() as u64;
    let record = ReservationRecord {
        state: RecordState::Pending,
        user: call.user.to_owned(),
        qty,
        ver: call.version,
        created_ms: Some(now),
        deadline_ms: Some(deadline),
        done_ms: None,
        reason: None,
        replayed: false,
        returned: None,
        tombstone: false,
        accepted_late: false,
        in_doubt: false,
        fence: 1,
        phase: call
            .steps
            .and_then(|s| s.at(now as i64))
            .map(|(_, p)| p.to_owned()),
    };
    let id = call.reservation_id.to_owned();
    part.records.insert(
        id.clone(),
        Rec {
            record,
            prior: 0,
            busy,
        },
    );
    let remaining = stock - qty as i64;
    part.stock.insert(call.version, remaining);
    *part.users.entry(call.user.to_owned()).or_default() += qty;
    part.ledgers
        .entry(call.version)
        .or_insert(empty_row(call.version))
        .pending += qty as i64;
    let due = part.due.entry(call.version).or_default();
    due.insert(id.clone(), deadline.max(busy));
    if let Some(field) = idem {
        part.idem.insert(field, id);
    }
    ReserveOutcome::Reserved {
        remaining: remaining as u64,
        created_ms: now,
        deadline_ms: deadline,
        fence: 1,
    }
}

/// The key's reservation answered again (`lua/reserve.lua`, its idempotency branch).
fn replay(
    part: &mut Part,
    field: &str,
    call: &ReserveCall<'_>,
    now: u64,
) -> Option<ReserveOutcome> {
    let id = part.idem.get(field)?.clone();
    let remaining = part.stock.get(&call.version).map(|s| *s as u64);
    let rec = part.records.get_mut(&id)?;
    let r = &mut rec.record;
    if r.state == RecordState::Released {
        return None;
    }
    let deadline = r.deadline_ms.unwrap_or(0);
    if r.state == RecordState::Pending && deadline <= now {
        return Some(ReserveOutcome::HoldRanOut);
    }
    if r.qty != u64::from(call.qty) {
        return Some(ReserveOutcome::ReplayQuantityDiffers { qty: r.qty as u32 });
    }
    r.replayed = true;
    if r.state == RecordState::Pending {
        r.fence += 1;
        rec.prior = rec.busy;
        rec.busy = rec.busy.max(now + call.in_flight.as_millis() as u64);
        if let Some(due) = part.due.get_mut(&r.ver).and_then(|d| d.get_mut(&id)) {
            *due = (*due).max(rec.busy);
        }
    }
    Some(ReserveOutcome::Replayed {
        id,
        qty: r.qty as u32,
        version: r.ver,
        remaining,
        created_ms: r.created_ms.unwrap_or(0),
        deadline_ms: deadline,
        fence: r.fence,
        phase: r.phase.clone(),
    })
}

/// A version stops being on sale in a segment: its units left are retired.
fn retire(part: &mut Part, version: u64) {
    if let Some(left) = part.stock.remove(&version) {
        let row = part.ledgers.entry(version).or_insert(empty_row(version));
        row.retired += left;
        row.unsold_retired += left;
    }
}

/// `deposit` of `lua/lib.lua`: once per transfer id, into the version it left.
fn deposit(part: &mut Part, version: u64, id: &str, qty: u64) -> Deposit {
    if part.received.contains_key(id) {
        return Deposit::AlreadyLanded;
    }
    let Some(row) = part.ledgers.get_mut(&version) else {
        return Deposit::Refused;
    };
    part.received.insert(id.to_owned(), qty);
    row.moved_in += qty as i64;
    match part.stock.get_mut(&version) {
        Some(stock) => *stock += qty as i64,
        None => {
            row.retired += qty as i64;
            row.unsold_retired += qty as i64;
        }
    }
    Deposit::Landed
}

/// `give_back` of `lua/lib.lua`: a pending or confirmed reservation becomes released, its units
/// back in stock (or retired, its version no longer on sale here). The units left, if on sale.
fn give_back(part: &mut Part, id: &str, now: u64, reason: ReleaseReason) -> Option<u64> {
    let rec = part.records.get_mut(id).expect("a record to give back");
    let r = &mut rec.record;
    let (qty, version, from) = (r.qty, r.ver, r.state);
    if let Some(held) = part.users.get_mut(&r.user) {
        *held = held.saturating_sub(qty);
        if *held == 0 {
            part.users.remove(&r.user);
        }
    }
    if let Some(due) = part.due.get_mut(&version) {
        due.remove(id);
    }
    let row = part.ledgers.entry(version).or_insert(empty_row(version));
    match from {
        RecordState::Pending => row.pending -= qty as i64,
        RecordState::Confirmed => row.confirmed -= qty as i64,
        RecordState::Released => unreachable!("released twice"),
    }
    row.released += qty as i64;
    let remaining = match part.stock.get_mut(&version) {
        Some(stock) => {
            *stock += qty as i64;
            Some(*stock as u64)
        }
        None => {
            row.retired += qty as i64;
            None
        }
    };
    r.returned = Some(remaining.is_some());
    r.state = RecordState::Released;
    r.done_ms = Some(now);
    r.reason = Some(reason.as_str().to_owned());
    remaining
}

mod calls;
