//! One script or command on one partition. Every call here is bounded by the store's time
//! budget; none of them loops over anything that grows with the sale (the sweep and confirm take
//! a bounded batch).

use super::records::{int, string};
use super::scripts;
use super::{
    ClaimOutcome, ConfirmOutcome, ConfirmedVia, LedgerRow, Partition, PartitionMeta,
    PrewarmOutcome, ReleaseMode, ReleaseOutcome, ReservationRecord, ReserveOutcome, StockStore,
    StoreError, SweepOutcome,
};
use crate::metrics::{ReleaseReason, ScriptName, StoreOp};
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
}

/// An outgoing transfer not yet acknowledged by its giving partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub id: String,
    pub version: u64,
    /// The receiving partition's index.
    pub to: u32,
    pub qty: u64,
    /// When it was withdrawn (Redis time, unix ms).
    pub at_ms: u64,
}

impl Transfer {
    fn parse(id: String, raw: &str) -> Option<Transfer> {
        let mut parts = raw.split('|');
        let transfer = Transfer {
            id,
            version: parts.next()?.parse().ok()?,
            to: parts.next()?.parse().ok()?,
            qty: parts.next()?.parse().ok()?,
            at_ms: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(transfer)
    }
}

/// One partition read in one MULTI/EXEC (see [`StockStore::snapshot`]).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub ledgers: Vec<LedgerRow>,
    pub records: Vec<ReservationRecord>,
    pub books: TransferBooks,
}

/// A partition's transfer records.
#[derive(Debug, Clone, Default)]
pub struct TransferBooks {
    /// Given, not yet acknowledged (in flight, or arrived and not yet known to have).
    pub open: Vec<Transfer>,
    pub acknowledged: Vec<Transfer>,
    /// Received: transfer id -> units.
    pub received: std::collections::HashMap<String, u64>,
}

/// How a sweep hands due reservations out for an order lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupLease {
    /// Due again this long after being handed out, unless settled meanwhile.
    pub lease: Duration,
    /// Released as expired once this long past the hold deadline; `None`: never.
    pub give_up_after: Option<Duration>,
}

/// A hash's fields and values, as HGETALL answers.
type Fields = Vec<(String, String)>;

/// A reply value as a Rust type.
fn from<T: redis::FromRedisValue>(v: &Value) -> Result<T, StoreError> {
    Ok(redis::from_redis_value_ref(v).map_err(redis::RedisError::from)?)
}

/// How many times prewarm reads a partition's meta again when it changed under it.
const PREWARM_ATTEMPTS: usize = 4;

impl StockStore {
    /// Atomically checks the per-user limit and the stock, deducts, and records the reservation
    /// (ledger, hold deadline from Redis's clock, event). With an idempotency key that already
    /// won, returns that reservation instead.
    pub async fn reserve(
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
            .arg(units);
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
            .arg(self.events_maxlen);
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
    /// it), and moves every key's expiry to `expire_at` if that is later.
    pub async fn prewarm(
        &self,
        partition: Partition<'_>,
        version: u64,
        units: u64,
        expire_at: u64,
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
                .arg(expire_at);
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
                Some(2) => PrewarmOutcome::MetaRepaired,
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

    /// A partition's meta (the base tag's also carries the activity's segment count).
    pub async fn meta(&self, partition: Partition<'_>) -> Result<PartitionMeta, StoreError> {
        let fields: Vec<(String, String)> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGETALL").arg(self.keys.of(partition).meta()),
            )
            .await?;
        Ok(PartitionMeta::parse(fields))
    }

    /// The base tag's meta of an activity id (its segment count), if it was ever prewarmed.
    pub async fn base_meta(&self, id: &str) -> Result<PartitionMeta, StoreError> {
        let layout = super::Layout::new(std::sync::Arc::from(id), 1);
        let fields: Vec<(String, String)> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGETALL").arg(self.keys.base(&layout).meta()),
            )
            .await?;
        Ok(PartitionMeta::parse(fields))
    }

    /// One version's stock and ledger in one partition, read atomically.
    pub async fn ledger(
        &self,
        partition: Partition<'_>,
        version: u64,
    ) -> Result<LedgerRow, StoreError> {
        let mut invocation = scripts::LEDGER.prepare_invoke();
        for key in self.keys.of(partition).for_ledger(version) {
            invocation.key(key);
        }
        let reply: Vec<i64> = self
            .eval(ScriptName::Ledger, StoreOp::Read, &invocation)
            .await?;
        LedgerRow::parse(version, &reply)
            .ok_or_else(|| StoreError::protocol(ScriptName::Ledger, reply))
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
    ) -> Result<bool, StoreError> {
        let mut invocation = scripts::DEPOSIT.prepare_invoke();
        for key in self.keys.of(receiver).for_deposit(version) {
            invocation.key(key);
        }
        invocation.arg(transfer_id).arg(qty);
        let deposited: i64 = self
            .eval(ScriptName::Transfer, StoreOp::Transfer, &invocation)
            .await?;
        Ok(deposited == 1)
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

    /// Transfers a partition gave but has not seen acknowledged, with Redis's time now (ms).
    pub async fn transfers(
        &self,
        giver: Partition<'_>,
    ) -> Result<(Vec<Transfer>, u64), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL")
            .arg(self.keys.of(giver).transfers())
            .cmd("TIME");
        let (raw, (secs, micros)): (Vec<(String, String)>, (u64, u64)) = self
            .bounded(StoreOp::Read, self.timeout, async {
                let mut conn = self.conn().await?;
                Ok(pipe.query_async(&mut conn).await?)
            })
            .await?;
        let transfers = raw
            .into_iter()
            .filter(|(id, _)| !id.is_empty())
            .filter_map(|(id, raw)| Transfer::parse(id, &raw))
            .collect();
        Ok((transfers, secs * 1000 + micros / 1000))
    }

    /// Every transfer a partition gave (not yet acknowledged, and acknowledged), read in one
    /// MULTI/EXEC: reconcile checks each transfer another partition received against it.
    pub async fn transfers_given(&self, giver: Partition<'_>) -> Result<Vec<Transfer>, StoreError> {
        let keys = self.keys.of(giver);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HGETALL")
            .arg(keys.transfers())
            .cmd("HGETALL")
            .arg(keys.acknowledged());
        let budget = self.timeout.max(Duration::from_secs(10));
        let (open, done): (Fields, Fields) = self
            .bounded(StoreOp::Read, budget, async {
                let mut conn = self.conn().await?;
                Ok(pipe.query_async(&mut conn).await?)
            })
            .await?;
        Ok(open
            .into_iter()
            .chain(done)
            .filter(|(id, _)| !id.is_empty())
            .filter_map(|(id, raw)| Transfer::parse(id, &raw))
            .collect())
    }

    /// Redis's `maxmemory-policy`, if it lets us read it (managed services may hide CONFIG).
    /// Anything but `noeviction` may evict flashgate's keys (all of which expire, so the
    /// `volatile-*` policies too), and a lost key can sell units twice.
    pub async fn eviction_policy(&self) -> Result<Option<String>, StoreError> {
        let reply: Result<Vec<String>, StoreError> = self
            .query(
                StoreOp::Read,
                redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy"),
            )
            .await;
        Ok(match reply {
            Ok(pair) => pair.into_iter().nth(1),
            Err(StoreError::Redis(e)) if e.kind() != redis::ErrorKind::Io => None,
            Err(e) => return Err(e),
        })
    }

    /// Makes a pending reservation due (for the sweep) no later than `at_ms`: the due time only
    /// moves earlier, and only for a reservation still in the pending set.
    pub async fn due_by(
        &self,
        partition: Partition<'_>,
        version: u64,
        reservation_id: &str,
        at_ms: u64,
    ) -> Result<(), StoreError> {
        self.query::<i64>(
            StoreOp::Sweep,
            redis::cmd("ZADD")
                .arg(self.keys.of(partition).pending(version))
                .arg("XX")
                .arg("LT")
                .arg(at_ms)
                .arg(reservation_id),
        )
        .await
        .map(|_| ())
    }

    /// Whether a partition has received a transfer.
    pub async fn received(
        &self,
        receiver: Partition<'_>,
        transfer_id: &str,
    ) -> Result<bool, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("HEXISTS")
                .arg(self.keys.of(receiver).received())
                .arg(transfer_id),
        )
        .await
    }

    /// A reservation's record, if the partition has one with that id.
    pub async fn lookup(
        &self,
        partition: Partition<'_>,
        reservation_id: &str,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let raw: Option<String> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGET")
                    .arg(self.keys.of(partition).reservations())
                    .arg(reservation_id),
            )
            .await?;
        raw.filter(|r| !r.is_empty())
            .map(|raw| {
                ReservationRecord::parse(&raw).ok_or_else(|| StoreError::Protocol {
                    script: "reservation record",
                    reply: raw,
                })
            })
            .transpose()
    }

    /// Every reservation record of a partition, the ledgers of the given versions and its
    /// transfer books, read in one MULTI/EXEC snapshot (for `flashgate reconcile`;
    /// O(reservations), not for the hot path).
    pub async fn snapshot(
        &self,
        partition: Partition<'_>,
        versions: &[u64],
    ) -> Result<Snapshot, StoreError> {
        let keys = self.keys.of(partition);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for &v in versions {
            // EVALSHA inside MULTI: a NOSCRIPT (after a restart or SCRIPT FLUSH) fails the
            // transaction, which is then sent again once the script is loaded.
            pipe.cmd("EVALSHA")
                .arg(scripts::LEDGER.get_hash())
                .arg(3)
                .arg(keys.for_ledger(v).as_slice());
        }
        pipe.cmd("HVALS").arg(keys.reservations());
        for key in [keys.transfers(), keys.acknowledged(), keys.received()] {
            pipe.cmd("HGETALL").arg(key);
        }
        // An operator command: allowed more time than a buyer's request.
        let budget = self.timeout.max(Duration::from_secs(10));
        let values: Vec<Value> = self
            .bounded(StoreOp::Read, budget, async {
                let mut conn = self.conn().await?;
                match pipe.query_async(&mut conn).await {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        scripts::LEDGER.load_async(&mut conn).await?;
                        Ok(pipe.query_async(&mut conn).await?)
                    }
                    other => Ok(other?),
                }
            })
            .await?;
        let n = versions.len();
        if values.len() != n + 4 {
            return Err(StoreError::protocol(ScriptName::Ledger, "snapshot"));
        }
        let mut ledgers = Vec::with_capacity(n);
        for (value, &v) in values.iter().zip(versions) {
            let reply: Vec<i64> = from(value)?;
            ledgers.push(
                LedgerRow::parse(v, &reply)
                    .ok_or_else(|| StoreError::protocol(ScriptName::Ledger, reply))?,
            );
        }
        let raw: Vec<String> = from(&values[n])?;
        let records = raw
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| {
                ReservationRecord::parse(r).ok_or_else(|| StoreError::Protocol {
                    script: "reservation record",
                    reply: r.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let transfers = |v: &Value| -> Result<Vec<Transfer>, StoreError> {
            let raw: Vec<(String, String)> = from(v)?;
            Ok(raw
                .into_iter()
                .filter(|(id, _)| !id.is_empty())
                .filter_map(|(id, raw)| Transfer::parse(id, &raw))
                .collect())
        };
        let received: Vec<(String, String)> = from(&values[n + 3])?;
        Ok(Snapshot {
            ledgers,
            records,
            books: TransferBooks {
                open: transfers(&values[n + 1])?,
                acknowledged: transfers(&values[n + 2])?,
                received: received
                    .into_iter()
                    .filter(|(id, _)| !id.is_empty())
                    .filter_map(|(id, qty)| Some((id, qty.parse().ok()?)))
                    .collect(),
            },
        })
    }

    /// Units remaining in `version` of one partition; `None` if its key does not exist.
    pub async fn remaining(
        &self,
        partition: Partition<'_>,
        version: u64,
    ) -> Result<Option<i64>, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("GET").arg(self.keys.of(partition).stock(version)),
        )
        .await
    }

    /// Records an activity id as prewarmed, with its segment count (called once the claim on its
    /// base tag succeeded, so the two agree), so that sweeps reach it even once it is removed
    /// from the configuration, and so that the count has a second record outside the activity's
    /// own keys. The registry lives as long as the longest-lived activity.
    pub async fn register(
        &self,
        id: &str,
        segments: u32,
        expire_at: u64,
    ) -> Result<(), StoreError> {
        let key = self.keys.registry();
        let mut pipe = redis::pipe();
        pipe.cmd("HSET").arg(&key).arg(id).arg(segments).ignore();
        pipe.cmd("EXPIREAT")
            .arg(&key)
            .arg(expire_at)
            .arg("NX")
            .ignore();
        pipe.cmd("EXPIREAT")
            .arg(&key)
            .arg(expire_at)
            .arg("GT")
            .ignore();
        self.bounded(StoreOp::Prewarm, self.timeout, async {
            let mut conn = self.conn().await?;
            Ok(pipe.query_async::<()>(&mut conn).await?)
        })
        .await
    }

    /// Every activity id ever prewarmed (and not yet expired), with its segment count.
    pub async fn registered(&self) -> Result<Vec<(String, u32)>, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("HGETALL").arg(self.keys.registry()),
        )
        .await
    }

    /// The segment count the registry recorded for an activity.
    pub async fn registered_segments(&self, id: &str) -> Result<Option<u32>, StoreError> {
        self.query(
            StoreOp::Read,
            redis::cmd("HGET").arg(self.keys.registry()).arg(id),
        )
        .await
    }
}
