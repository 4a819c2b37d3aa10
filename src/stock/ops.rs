//! One script or command on one partition. Every call here is bounded by the store's time
//! budget; none of them loops over anything that grows with the sale (the sweep and confirm take
//! a bounded batch).

use super::records::{int, string};
use super::scripts;
use super::{
    ClaimOutcome, ConfirmOutcome, ConfirmedVia, Deposit, Partition, PrewarmOutcome, ReleaseMode,
    ReleaseOutcome, ReleaseReason, ReserveOutcome, ScriptName, StockStore, StoreError, StoreOp,
    SweepOutcome,
};
use crate::config::Activity;
use redis::Value;
use std::time::Duration;

/// One reserve call's inputs.
#[derive(Debug, Clone, Copy)]
pub struct ReserveCall<'a> {
    pub user: &'a str,
    pub qty: u32,
    pub per_user_limit: u32,
    pub version: u64,
    pub reservation_id: &'a str,
    pub hold: Duration,
    /// The buyer's `Idempotency-Key`, if any.
    pub idempotency_key: Option<&'a str>,
    /// A transfer withdrawn from another partition, deposited in the same step: (id, units).
    pub deposit: Option<(&'a str, u64)>,
    /// The longest a forwarded request may take: the reservation is not due for the sweep
    /// before that long from now (nor, when replayed, from the replay), whatever its hold.
    pub in_flight: Duration,
    /// Only answer the `idempotency_key`'s reservation, if it has one; never take stock.
    pub replay_only: bool,
    /// When new reservations may be made, checked by the script on Redis's clock.
    pub hours: SaleHours,
}

/// A sale's hours as unix ms, `opens_ms <= now < closes_ms`, judged by the script on Redis's
/// clock: a gateway whose clock runs ahead or behind checks the hours itself first (and may
/// turn a buyer away early or late), but never reserves outside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleHours {
    pub opens_ms: i64,
    pub closes_ms: i64,
}

impl SaleHours {
    /// No bounds (tools and tests that call the store directly).
    pub const ALWAYS: SaleHours = SaleHours {
        opens_ms: i64::MIN,
        closes_ms: i64::MAX,
    };

    pub fn of(activity: &Activity) -> Self {
        SaleHours {
            opens_ms: activity.starts_at.timestamp_millis(),
            closes_ms: activity.ends_at.timestamp_millis(),
        }
    }
}

/// How a sweep hands due reservations out for an order lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupLease {
    /// Due again this long after being handed out, unless settled meanwhile.
    pub lease: Duration,
    /// Released as expired once this long past the hold deadline; `None`: never.
    pub give_up_after: Option<Duration>,
}

/// How many times prewarm reads a partition's meta again when it changed under it.
const PREWARM_ATTEMPTS: usize = 4;

impl StockStore {
    /// Atomically checks the per-user limit and the stock, deducts, and records the reservation
    /// (ledger, hold deadline from Redis's clock, event). With an idempotency key that already
    /// won, returns that reservation instead; one pending under another version is asked for
    /// again with that version's keys (replay only), so its due time moves where the sweep
    /// reads it, and if it was settled in between, the purchase is asked for again as it was.
    pub async fn reserve(
        &self,
        partition: Partition<'_>,
        call: &ReserveCall<'_>,
    ) -> Result<ReserveOutcome, StoreError> {
        let mut asked = *call;
        for _ in 0..3 {
            match self.reserve_once(partition, &asked).await? {
                ReserveOutcome::OtherVersion { version } => {
                    asked = ReserveCall {
                        version,
                        replay_only: true,
                        deposit: None,
                        ..*call
                    };
                }
                ReserveOutcome::NotReplayed | ReserveOutcome::NoStockKey
                    if asked.replay_only && !call.replay_only =>
                {
                    asked = ReserveCall {
                        deposit: None,
                        ..*call
                    };
                }
                outcome => return Ok(outcome),
            }
        }
        Ok(ReserveOutcome::Contended)
    }

    /// One reserve script call.
    async fn reserve_once(
        &self,
        partition: Partition<'_>,
        call: &ReserveCall<'_>,
    ) -> Result<ReserveOutcome, StoreError> {
        let idempotency_field = call
            .idempotency_key
            .map(|key| format!("{}\n{key}", call.user))
            .unwrap_or_default();
        let (transfer, units) = call.deposit.unwrap_or(("", 0));
        let mut invocation = scripts::RESERVE.prepare_invoke();
        for key in self.keys.of(partition).for_reserve(call.version) {
            invocation.key(key);
        }
        invocation
            .arg(call.user)
            .arg(call.qty)
            .arg(call.per_user_limit)
            .arg(call.version)
            .arg(call.reservation_id)
            .arg(call.hold.as_millis() as u64)
            .arg(idempotency_field)
            .arg(self.events_maxlen)
            .arg(transfer)
            .arg(units)
            .arg(call.in_flight.as_millis() as u64)
            .arg(if call.replay_only { "1" } else { "0" })
            .arg(call.hours.opens_ms)
            .arg(call.hours.closes_ms);
        let reply: Vec<Value> = self
            .eval(ScriptName::Reserve, StoreOp::Reserve, &invocation)
            .await?;
        ReserveOutcome::parse(&reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Reserve, reply))
    }

    /// Gives a reservation's units back to its version's stock (or retires them) and to its
    /// user, exactly once, as far as `mode` allows (see [`ReleaseMode`]).
    pub async fn release(
        &self,
        partition: Partition<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        let mut invocation = scripts::RELEASE.prepare_invoke();
        for key in self.keys.of(partition).for_release(version) {
            invocation.key(key);
        }
        invocation
            .arg(reservation_id)
            .arg(version)
            .arg(reason.as_str())
            .arg(mode.as_str())
            .arg(self.events_maxlen)
            .arg(mode.fence().map(|f| f.to_string()).unwrap_or_default());
        let reply: Vec<i64> = self
            .eval(ScriptName::Release, StoreOp::Release, &invocation)
            .await?;
        ReleaseOutcome::parse(&reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Release, reply))
    }

    /// Moves pending reservations of one version to confirmed, each exactly once; one outcome
    /// per id, in order. The caller keeps batches small (one script call confirms them all).
    pub async fn confirm(
        &self,
        partition: Partition<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> Result<Vec<ConfirmOutcome>, StoreError> {
        let mut invocation = scripts::CONFIRM.prepare_invoke();
        for key in self.keys.of(partition).for_confirm(version) {
            invocation.key(key);
        }
        invocation
            .arg(version)
            .arg(via.as_str())
            .arg(self.events_maxlen);
        for id in reservation_ids {
            invocation.arg(*id);
        }
        let reply: Vec<i64> = self
            .eval(ScriptName::Confirm, StoreOp::Confirm, &invocation)
            .await?;
        let outcomes: Option<Vec<ConfirmOutcome>> =
            reply.iter().map(|&r| ConfirmOutcome::parse(r)).collect();
        match outcomes {
            Some(o) if o.len() == reservation_ids.len() => Ok(o),
            _ => Err(StoreError::protocol(ScriptName::Confirm, reply)),
        }
    }

    /// Handles up to `batch` pending reservations of one version whose time has come: released
    /// as expired, or, with a `lookup`, handed out to ask the backend about (and due again after
    /// its lease unless settled meanwhile; released as expired once past its give-up time).
    pub async fn sweep(
        &self,
        partition: Partition<'_>,
        version: u64,
        batch: u32,
        lookup: Option<LookupLease>,
    ) -> Result<SweepOutcome, StoreError> {
        let mut invocation = scripts::SWEEP.prepare_invoke();
        for key in self.keys.of(partition).for_sweep(version) {
            invocation.key(key);
        }
        invocation
            .arg(batch)
            .arg(self.events_maxlen)
            .arg(lookup.map_or(0, |l| l.lease.as_millis().max(1) as u64))
            .arg(
                lookup
                    .and_then(|l| l.give_up_after)
                    .map_or(0, |g| g.as_millis().max(1) as u64),
            );
        let reply: Vec<Value> = self
            .eval(ScriptName::Sweep, StoreOp::Sweep, &invocation)
            .await?;
        SweepOutcome::parse(&reply).ok_or_else(|| StoreError::protocol(ScriptName::Sweep, reply))
    }

    /// Checks an activity's configuration against what Redis recorded on its base tag (segment
    /// count, newest version, key layout) and claims the version as the newest.
    pub async fn claim(
        &self,
        layout: &super::Layout,
        version: u64,
        expire_at: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut invocation = scripts::CLAIM.prepare_invoke();
        for key in self.keys.for_claim(layout, version) {
            invocation.key(key);
        }
        invocation.arg(version).arg(layout.count()).arg(expire_at);
        let reply: Vec<Value> = self
            .eval(ScriptName::Prewarm, StoreOp::Prewarm, &invocation)
            .await?;
        ClaimOutcome::parse(&reply).ok_or_else(|| StoreError::protocol(ScriptName::Prewarm, reply))
    }

    /// Puts `version` on sale in one partition with `units`, once (retiring the version before
    /// it), and moves every key's expiry to `expire_at` if that is later. `made_before`: the
    /// activity's base meta records the partition as made (a partition then found empty lost
    /// everything, and is refused as damaged).
    pub async fn prewarm(
        &self,
        partition: Partition<'_>,
        version: u64,
        units: u64,
        expire_at: u64,
        made_before: bool,
    ) -> Result<PrewarmOutcome, StoreError> {
        let mut meta = self.meta(partition).await?;
        for _ in 0..PREWARM_ATTEMPTS {
            let others: Vec<u64> = meta
                .versions
                .iter()
                .copied()
                .chain(meta.current)
                .filter(|&v| v != version)
                .collect::<std::collections::BTreeSet<u64>>()
                .into_iter()
                .collect();
            let mut invocation = scripts::PREWARM.prepare_invoke();
            for key in self.keys.of(partition).for_prewarm(version, &others) {
                invocation.key(key);
            }
            invocation
                .arg(version)
                .arg(meta.current.map(|c| c.to_string()).unwrap_or_default())
                .arg(units)
                .arg(expire_at)
                .arg(if made_before { "1" } else { "0" });
            for v in &others {
                invocation.arg(*v);
            }
            let reply: Vec<Value> = self
                .eval(ScriptName::Prewarm, StoreOp::Prewarm, &invocation)
                .await?;
            let current = string(reply.get(1)).and_then(|c| c.parse::<u64>().ok());
            return Ok(match int(reply.first()) {
                Some(1) => PrewarmOutcome::Created,
                Some(0) => PrewarmOutcome::Exists,
                Some(-4) => PrewarmOutcome::Damaged,
                Some(-1) => PrewarmOutcome::StockKeyRemoved,
                Some(-2) => PrewarmOutcome::Older {
                    current: current.unwrap_or(0),
                },
                Some(-3) => {
                    meta = self.meta(partition).await?;
                    continue;
                }
                _ => return Err(StoreError::protocol(ScriptName::Prewarm, reply)),
            });
        }
        Err(StoreError::protocol(
            ScriptName::Prewarm,
            "what is on sale kept changing while prewarming",
        ))
    }

    /// First half of moving units between partitions: takes up to `want` units of `version` out
    /// of `giver`. Returns the units taken (0: it has none, or that version is not on sale there).
    pub async fn withdraw(
        &self,
        giver: Partition<'_>,
        version: u64,
        transfer_id: &str,
        want: u64,
        to: u32,
    ) -> Result<u64, StoreError> {
        let mut invocation = scripts::WITHDRAW.prepare_invoke();
        for key in self.keys.of(giver).for_withdraw(version) {
            invocation.key(key);
        }
        invocation.arg(transfer_id).arg(want).arg(to).arg(version);
        self.eval(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await
    }

    /// Second half on its own: the units arrive in `version` of `receiver`, once per transfer id.
    /// `Ok(false)` if they had arrived already (or that version has no ledger there).
    pub async fn deposit(
        &self,
        receiver: Partition<'_>,
        version: u64,
        transfer_id: &str,
        qty: u64,
    ) -> Result<Deposit, StoreError> {
        let mut invocation = scripts::DEPOSIT.prepare_invoke();
        for key in self.keys.of(receiver).for_deposit(version) {
            invocation.key(key);
        }
        invocation.arg(transfer_id).arg(qty);
        let code: i64 = self
            .eval(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await?;
        Deposit::parse(code).ok_or_else(|| StoreError::protocol(ScriptName::Transfer, code))
    }

    /// The giving partition learns a transfer arrived (it is kept, as acknowledged).
    pub async fn acknowledge(
        &self,
        giver: Partition<'_>,
        transfer_id: &str,
    ) -> Result<(), StoreError> {
        let mut invocation = scripts::ACKNOWLEDGE.prepare_invoke();
        for key in self.keys.of(giver).for_acknowledge() {
            invocation.key(key);
        }
        invocation.arg(transfer_id);
        self.eval::<i64>(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await
            .map(|_| ())
    }

    /// Makes a pending reservation due (for the sweep and its order lookup) no later than
    /// `after` from now, by Redis's clock, for a forward that ended without an answer and got
    /// `fence`: the due time only moves earlier, only while the fence is still that forward's,
    /// and never before the trips of the forwards before it end (see `lua/due.lua`).
    pub async fn due_in(
        &self,
        partition: Partition<'_>,
        version: u64,
        reservation_id: &str,
        fence: u64,
        after: Duration,
    ) -> Result<(), StoreError> {
        let mut invocation = scripts::DUE.prepare_invoke();
        for key in self.keys.of(partition).for_due(version) {
            invocation.key(key);
        }
        invocation
            .arg(reservation_id)
            .arg(after.as_millis() as u64)
            .arg(fence);
        self.eval::<i64>(ScriptName::Sweep, StoreOp::Sweep, &invocation)
            .await
            .map(|_| ())
    }
}
