//! The fake store's answers to the store's calls ([`Reads`], [`Settle`], [`Publish`]), each
//! following its script in `lua/` as far as the fake's module doc says.

use super::{deposit, empty_row, give_back, FakeStore, Part, Rec};
use crate::config::Activity;
use crate::stock::prelude::*;
use crate::stock::segments::{Prewarmed, Refusal, Reserving};
use crate::stock::{
    ConfirmOutcome, ConfirmedVia, Deposit, Layout, Leased, LedgerRow, LookupLease, Publish, Reads,
    RecordState, ReleaseMode, ReleaseOutcome, ReleaseReason, ReservationRecord, Segment,
    SegmentMeta, StoreError, SweepOutcome, Transfer,
};
use crate::stock::{ReserveCall, ReserveOutcome, RestockOutcome};
use std::sync::Arc;
use std::time::Duration;

impl Reads for FakeStore {
    async fn meta(&self, segment: Segment<'_>) -> Result<SegmentMeta, StoreError> {
        let state = self.enter("meta")?;
        Ok(state
            .parts
            .get(&segment.tag())
            .map(|p| p.meta.clone())
            .unwrap_or_default())
    }

    async fn base_meta(&self, id: &str) -> Result<SegmentMeta, StoreError> {
        let state = self.enter("base_meta")?;
        let tag = Layout::new(Arc::from(id), 1).segment(0).expect("one").tag();
        let mut meta = state
            .parts
            .get(&tag)
            .map(|p| p.meta.clone())
            .unwrap_or_default();
        if let Some(base) = state.bases.get(id) {
            meta.segments = base.segments;
            meta.newest = base.newest;
            meta.made = base.made.clone();
        }
        Ok(meta)
    }

    async fn registered(&self) -> Result<Vec<(String, u32)>, StoreError> {
        let state = self.enter("registered")?;
        Ok(state
            .registry
            .iter()
            .map(|(id, n)| (id.clone(), *n))
            .collect())
    }

    async fn registered_segments(&self, id: &str) -> Result<Option<u32>, StoreError> {
        Ok(self.enter("registered_segments")?.registry.get(id).copied())
    }

    async fn lookup(
        &self,
        segment: Segment<'_>,
        reservation_id: &str,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let state = self.enter("lookup")?;
        Ok(state
            .parts
            .get(&segment.tag())
            .and_then(|p| p.records.get(reservation_id))
            .map(|r| r.record.clone()))
    }

    async fn transfers(&self, giver: Segment<'_>) -> Result<(Vec<Transfer>, u64), StoreError> {
        let now = self.now_ms();
        let state = self.enter("transfers")?;
        let open = state
            .parts
            .get(&giver.tag())
            .map(|p| p.transfers.values().cloned().collect())
            .unwrap_or_default();
        Ok((open, now))
    }
}

impl ReserveScript for FakeStore {
    /// `lua/reserve.lua` (see [`FakeStore::reserve_now`]).
    async fn reserve(
        &self,
        segment: Segment<'_>,
        call: &ReserveCall<'_>,
    ) -> Result<ReserveOutcome, StoreError> {
        drop(self.enter("reserve")?);
        Ok(self.reserve_now(segment, call))
    }
}

impl Reserving for FakeStore {
    /// The claim and prewarm: refused as the test said or when a newer version was claimed,
    /// else the version goes on sale in every segment (once: a version on sale is not
    /// reset).
    async fn prewarm(&self, activity: &Activity) -> Result<Result<Prewarmed, Refusal>, StoreError> {
        {
            let mut state = self.enter("prewarm")?;
            state.prewarms += 1;
            if let Some(refusal) = state.refusal.clone() {
                return Ok(Err(refusal));
            }
            let newest = state.bases.get(&*activity.id).and_then(|b| b.newest);
            if let Some(newest) = newest.filter(|&n| n > activity.version) {
                return Ok(Err(Refusal::OlderVersion {
                    id: activity.id.to_string(),
                    configured: activity.version,
                    newest,
                }));
            }
        }
        self.on_sale(&Layout::of(activity), activity.version, activity.stock);
        Ok(Ok(Prewarmed::default()))
    }
}

impl Publish for FakeStore {
    fn news_channel(&self) -> String {
        "fake:news".to_owned()
    }

    async fn publish(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        let mut state = self.enter("publish")?;
        state
            .published
            .push((channel.to_owned(), message.to_owned()));
        Ok(())
    }
}

/// The released marker an abandon writes for an id that never reserved anything.
fn tombstone(version: u64, now: u64, reason: ReleaseReason) -> ReservationRecord {
    ReservationRecord {
        state: RecordState::Released,
        user: String::new(),
        qty: 0,
        ver: version,
        created_ms: None,
        deadline_ms: None,
        done_ms: Some(now),
        reason: Some(reason.as_str().to_owned()),
        replayed: false,
        returned: None,
        tombstone: true,
        accepted_late: false,
        in_doubt: false,
        fence: 0,
        phase: None,
    }
}

/// The backend took a released reservation (`accepted_late` in `lua/confirm.lua`): counted
/// once; covered from the version's stock by a confirmed `<id>-late` record if it has the
/// units, else oversold.
fn accepted_late(part: &mut Part, id: &str, now: u64) -> ConfirmOutcome {
    let rec = part.records.get_mut(id).expect("the record confirmed");
    rec.record.accepted_late = true;
    let (qty, version, user) = (rec.record.qty, rec.record.ver, rec.record.user.clone());
    let row = part.ledgers.entry(version).or_insert(empty_row(version));
    row.late_accepted += qty as i64;
    let cover = format!("{id}-late");
    match part.stock.get_mut(&version) {
        Some(stock) if *stock >= qty as i64 && !part.records.contains_key(&cover) => {
            *stock -= qty as i64;
            row.confirmed += qty as i64;
            *part.users.entry(user.clone()).or_default() += qty;
            let record = ReservationRecord {
                state: RecordState::Confirmed,
                user,
                qty,
                ver: version,
                created_ms: Some(now),
                deadline_ms: None,
                done_ms: Some(now),
                reason: Some("late_accepted".to_owned()),
                replayed: false,
                returned: None,
                tombstone: false,
                accepted_late: false,
                in_doubt: false,
                fence: 0,
                phase: None,
            };
            part.records.insert(
                cover,
                Rec {
                    record,
                    prior: 0,
                    busy: 0,
                },
            );
            ConfirmOutcome::LateCovered
        }
        _ => {
            row.oversold += qty as i64;
            ConfirmOutcome::LateOversold
        }
    }
}

impl LedgerScript for FakeStore {
    async fn ledger(&self, segment: Segment<'_>, version: u64) -> Result<LedgerRow, StoreError> {
        let state = self.enter("ledger")?;
        let Some(part) = state.parts.get(&segment.tag()) else {
            return Ok(empty_row(version));
        };
        let mut row = part
            .ledgers
            .get(&version)
            .copied()
            .unwrap_or(empty_row(version));
        row.ledger = part.ledgers.contains_key(&version);
        row.stock_key = part.stock.contains_key(&version);
        row.remaining = part.stock.get(&version).copied().unwrap_or(0);
        row.pending_reservations = part.due.get(&version).map_or(0, |d| d.len() as i64);
        Ok(row)
    }
}

impl ReleaseScript for FakeStore {
    /// `lua/release.lua`.
    async fn release(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        let now = self.now_ms();
        let mut state = self.enter("release")?;
        let part = state.parts.entry(segment.tag()).or_default();
        let Some(rec) = part.records.get(reservation_id) else {
            if mode == ReleaseMode::Abandon {
                let record = tombstone(version, now, reason);
                part.records.insert(
                    reservation_id.to_owned(),
                    Rec {
                        record,
                        prior: 0,
                        busy: 0,
                    },
                );
            }
            return Ok(ReleaseOutcome::Unknown);
        };
        let r = &rec.record;
        let owner = matches!(mode, ReleaseMode::Owner | ReleaseMode::Abandon);
        let deadline = r.deadline_ms.unwrap_or(0);
        Ok(match mode {
            _ if r.state == RecordState::Released => ReleaseOutcome::AlreadyReleased,
            _ if r.ver != version => ReleaseOutcome::VersionMismatch,
            m if r.state == RecordState::Confirmed && m != ReleaseMode::Admin => {
                ReleaseOutcome::KeptConfirmed
            }
            _ if r.replayed && owner => ReleaseOutcome::KeptReplayed,
            ReleaseMode::Lookup { fence } if r.fence != fence => ReleaseOutcome::Fenced,
            ReleaseMode::Lookup { .. } if deadline > now => {
                let at = deadline.max(rec.busy);
                if let Some(due) = part
                    .due
                    .get_mut(&version)
                    .and_then(|d| d.get_mut(reservation_id))
                {
                    *due = at;
                }
                ReleaseOutcome::TooEarly
            }
            _ => ReleaseOutcome::Released {
                remaining: give_back(part, reservation_id, now, reason),
            },
        })
    }
}

impl ConfirmScript for FakeStore {
    /// `lua/confirm.lua`.
    async fn confirm(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> Result<Vec<ConfirmOutcome>, StoreError> {
        // A round trip: confirms arriving meanwhile queue behind this one.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        let now = self.now_ms();
        let mut state = self.enter("confirm")?;
        state.confirm_calls.push(reservation_ids.len());
        let part = state.parts.entry(segment.tag()).or_default();
        let mut out = Vec::with_capacity(reservation_ids.len());
        for &id in reservation_ids {
            let Some(rec) = part.records.get_mut(id) else {
                out.push(ConfirmOutcome::Unknown);
                continue;
            };
            let r = &mut rec.record;
            out.push(match r.state {
                _ if r.ver != version => ConfirmOutcome::VersionMismatch,
                RecordState::Confirmed => ConfirmOutcome::AlreadyConfirmed,
                RecordState::Released
                    if via == ConfirmedVia::Admin
                        || r.reason.as_deref() == Some(ReleaseReason::Admin.as_str())
                        || r.tombstone
                        || r.accepted_late =>
                {
                    ConfirmOutcome::Released
                }
                RecordState::Released => accepted_late(part, id, now),
                RecordState::Pending => {
                    r.state = RecordState::Confirmed;
                    r.done_ms = Some(now);
                    let qty = r.qty as i64;
                    if let Some(row) = part.ledgers.get_mut(&version) {
                        row.pending -= qty;
                        row.confirmed += qty;
                    }
                    if let Some(due) = part.due.get_mut(&version) {
                        due.remove(id);
                    }
                    ConfirmOutcome::Confirmed
                }
            });
        }
        Ok(out)
    }
}

impl SweepScript for FakeStore {
    /// `lua/sweep.lua`.
    async fn sweep(
        &self,
        segment: Segment<'_>,
        version: u64,
        batch: u32,
        lookup: Option<LookupLease>,
    ) -> Result<SweepOutcome, StoreError> {
        let now = self.now_ms();
        let mut state = self.enter("sweep")?;
        let part = state.parts.entry(segment.tag()).or_default();
        let mut due: Vec<(u64, String)> = part
            .due
            .get(&version)
            .into_iter()
            .flatten()
            .filter(|(_, at)| **at <= now)
            .map(|(id, at)| (*at, id.clone()))
            .collect();
        due.sort();
        due.truncate(batch as usize);
        let lease = lookup.map_or(0, |l| l.lease.as_millis().max(1) as u64);
        let give_up = lookup
            .and_then(|l| l.give_up_after)
            .map_or(0, |g| g.as_millis().max(1) as u64);
        let mut outcome = SweepOutcome {
            scanned: due.len() as u64,
            ..SweepOutcome::default()
        };
        for (_, id) in due {
            let pending = part
                .records
                .get_mut(&id)
                .filter(|r| r.record.state == RecordState::Pending);
            let Some(rec) = pending else {
                part.due.get_mut(&version).map(|d| d.remove(&id));
                continue;
            };
            let deadline = rec.record.deadline_ms.unwrap_or(0);
            if lease > 0 && (give_up == 0 || deadline + give_up > now) {
                rec.record.fence += 1;
                let fence = rec.record.fence;
                part.due
                    .get_mut(&version)
                    .map(|d| d.insert(id.clone(), now + lease));
                outcome.for_lookup.push(Leased { id, fence });
            } else if lease == 0 && deadline > now {
                part.due
                    .get_mut(&version)
                    .map(|d| d.insert(id.clone(), deadline));
            } else {
                let qty = rec.record.qty;
                if give_back(part, &id, now, ReleaseReason::Expired).is_none() {
                    outcome.retired += 1;
                }
                outcome.released += 1;
                outcome.units += qty;
            }
        }
        Ok(outcome)
    }
}

impl RestockScript for FakeStore {
    /// `lua/restock.lua` (without its once-per-key book: the fake does not keep one).
    async fn restock(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        _idempotency_key: Option<&str>,
        _expire_at: u64,
    ) -> Result<RestockOutcome, StoreError> {
        let mut state = self.enter("restock")?;
        let part = state.parts.entry(segment.tag()).or_default();
        if !part.stock.contains_key(&version) {
            return Ok(RestockOutcome::NotOnSale);
        }
        let Some(row) = part.ledgers.get_mut(&version) else {
            return Ok(RestockOutcome::Damaged);
        };
        row.restocked += units as i64;
        let stock = part.stock.get_mut(&version).expect("checked above");
        *stock += units as i64;
        Ok(RestockOutcome::Added {
            remaining: *stock as u64,
        })
    }
}

impl DueScript for FakeStore {
    /// `lua/due.lua`.
    async fn due_in(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        fence: u64,
        after: Duration,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let mut state = self.enter("due_in")?;
        let part = state.parts.entry(segment.tag()).or_default();
        let Some(rec) = part.records.get(reservation_id) else {
            return Ok(());
        };
        if rec.record.state != RecordState::Pending || rec.record.fence != fence {
            return Ok(());
        }
        let at = (now + after.as_millis() as u64).max(rec.prior);
        if let Some(due) = part
            .due
            .get_mut(&version)
            .and_then(|d| d.get_mut(reservation_id))
        {
            *due = (*due).min(at);
        }
        Ok(())
    }
}

impl WithdrawScript for FakeStore {
    /// `lua/withdraw.lua`.
    async fn withdraw(
        &self,
        giver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        want: u64,
        to: u32,
    ) -> Result<u64, StoreError> {
        drop(self.enter("withdraw")?);
        Ok(self.withdraw_now(giver, version, transfer_id, want, to))
    }
}

impl DepositScript for FakeStore {
    /// `lua/deposit.lua`.
    async fn deposit(
        &self,
        receiver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        qty: u64,
    ) -> Result<Deposit, StoreError> {
        let mut state = self.enter("deposit")?;
        let part = state.parts.entry(receiver.tag()).or_default();
        Ok(deposit(part, version, transfer_id, qty))
    }
}

impl AcknowledgeScript for FakeStore {
    /// `lua/acknowledge.lua`.
    async fn acknowledge(&self, giver: Segment<'_>, transfer_id: &str) -> Result<(), StoreError> {
        let mut state = self.enter("acknowledge")?;
        let part = state.parts.entry(giver.tag()).or_default();
        if let Some(t) = part.transfers.remove(transfer_id) {
            part.acknowledged.insert(transfer_id.to_owned(), t);
        }
        Ok(())
    }
}
