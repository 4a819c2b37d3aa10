//! Fate writes `redis.ack_replicas` replicas did not acknowledge: a confirm, a release or a
//! sweep (the writes that decide what becomes of a unit) whose `WAIT` saw fewer replicas than
//! asked, or whose answer was lost. Each is kept in this process's memory, per segment (its
//! master record), and sent again by the segment's master check (confirms and releases are
//! idempotent by id; a sweep is not sent again: the next sweep does its work, and the check's
//! own acknowledged write covers what it wrote) until answered and acknowledged: the check's
//! call of `lua/master.lua` says so meanwhile (`unacked`), followed by a `WAIT` on the same
//! connection, and only a `WAIT` that saw enough replicas after every write kept here was sent
//! again forgets them. While any is kept, `replicas_acknowledged` lifts no fence of the segment
//! (see `lift_rule` in lua/master.lua).
//!
//! Approximation: the memory is this process's; a gateway that restarts while it holds an
//! unacknowledged write forgets it, and a fence begun more than the settle period after its
//! last report may then lift by the rule.

use super::super::{ConfirmedVia, ReleaseMode, ReleaseReason};
use parking_lot::Mutex;
use std::collections::HashMap;

/// One write that decides a unit's fate, as sent (so it can be sent again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::stock) enum FateWrite {
    Confirm {
        version: u64,
        ids: Vec<String>,
        via: ConfirmedVia,
    },
    Release {
        version: u64,
        id: String,
        mode: ReleaseMode,
        reason: ReleaseReason,
    },
    /// A sweep's expiries or hand-outs: never sent again (a second sweep is another sweep, and
    /// the sweep loop calls again anyway); the check's acknowledged write covers it.
    Sweep,
}

/// The unacknowledged fate writes, per segment's master record.
#[derive(Default)]
pub struct Unacked {
    held: Mutex<HashMap<String, Vec<FateWrite>>>,
}

impl Unacked {
    /// Keeps `write` for the segment of `record` (once: the same write failing again is kept
    /// once).
    pub(in crate::stock) fn hold(&self, record: &str, write: FateWrite) {
        let mut held = self.held.lock();
        let writes = held.entry(record.to_owned()).or_default();
        if !writes.contains(&write) {
            writes.push(write);
        }
    }

    /// Whether any write of the segment of `record` is kept.
    pub(in crate::stock) fn holds(&self, record: &str) -> bool {
        self.held.lock().get(record).is_some_and(|w| !w.is_empty())
    }

    /// Takes every write kept for the segment of `record` (to send again; what is not
    /// acknowledged is put back with [`Unacked::put_back`]).
    pub(in crate::stock) fn take(&self, record: &str) -> Vec<FateWrite> {
        self.held.lock().remove(record).unwrap_or_default()
    }

    /// Keeps `writes` again (those taken and not acknowledged).
    pub(in crate::stock) fn put_back(&self, record: &str, writes: Vec<FateWrite>) {
        for write in writes {
            self.hold(record, write);
        }
    }

    /// Every unacknowledged write this process keeps, over all segments.
    pub fn count(&self) -> usize {
        self.held.lock().values().map(Vec::len).sum()
    }
}

use super::super::{ScriptName, Segment, StockStore, StoreError, StoreOp};
use redis::FromRedisValue;

impl StockStore {
    /// A fate write (`cmd`, an EVALSHA of `source`): with `redis.ack_replicas`, followed by its
    /// `WAIT` on the same connection, as the reserve is (`RedisClient::eval_cmd_acknowledged`).
    /// A write fewer replicas acknowledged than asked, or whose answer was lost, is kept to be
    /// sent again (`write`, given the answer if one came; `None`: nothing to keep), logged and
    /// counted (`flashgate_redis_unacknowledged_writes_total{script}`); its answer is returned
    /// all the same (what it did on the master is done: a confirm's buyer has the backend's
    /// order).
    pub(in crate::stock) async fn fate_call<T: FromRedisValue>(
        &self,
        segment: Segment<'_>,
        script: ScriptName,
        source: &redis::Script,
        op: StoreOp,
        cmd: &redis::Cmd,
        write: impl FnOnce(Option<&T>) -> Option<FateWrite>,
    ) -> Result<T, StoreError> {
        if self.ack_replicas == 0 {
            return self
                .redis
                .once_more(op.idempotent(), || {
                    self.redis.eval_cmd(script, source, op, cmd)
                })
                .await;
        }
        let answer = self
            .redis
            .eval_cmd_acknowledged::<T>(
                script,
                source,
                op,
                cmd,
                self.ack_replicas,
                self.ack_wait_ms(),
            )
            .await;
        let (kept, acknowledged) = match &answer {
            Ok((_, acknowledged)) if *acknowledged >= self.ack_replicas => (None, None),
            Ok((reply, acknowledged)) => (write(Some(reply)), Some(*acknowledged)),
            Err(e) if e.may_have_landed() => (write(None), None),
            Err(_) => (None, None),
        };
        if let Some(kept) = kept {
            self.unacknowledged(segment, script, kept, acknowledged);
        }
        answer.map(|(reply, _)| reply)
    }

    /// How long a fate write's (and the master check's) `WAIT` waits for the replicas: half
    /// the time budget, so that a short count is answered within the connection's response
    /// timeout (`redis.timeout_ms`) instead of being cut as a lost answer.
    pub(in crate::stock) fn ack_wait_ms(&self) -> u64 {
        (self.timeout().as_millis() as u64 / 2).max(1)
    }

    /// Keeps `write` of `segment` to be sent again, and says so (`acknowledged`: the replicas
    /// its `WAIT` saw; `None`: its answer was lost).
    fn unacknowledged(
        &self,
        segment: Segment<'_>,
        script: ScriptName,
        write: FateWrite,
        acknowledged: Option<u32>,
    ) {
        self.redis
            .metrics()
            .unacknowledged_writes
            .with_label_values(&[script.as_str()])
            .inc();
        tracing::warn!(activity = %segment.layout().id(), segment = segment.index(),
            script = script.as_str(), acknowledged, wanted = self.ack_replicas,
            "a write deciding units' fate was not acknowledged by redis.ack_replicas replicas \
             in time: kept and sent again until it is; meanwhile a promoted replica stays \
             fenced until an operator resumes it");
        let record = self.keys.of(segment).master();
        self.failover.unacked.hold(&record, write);
    }

    /// Sends `write` of `segment` again (no `WAIT`: the master check's follows it). Whether it
    /// was answered.
    async fn resend(&self, segment: Segment<'_>, write: &FateWrite) -> bool {
        match write {
            FateWrite::Confirm { version, ids, via } => {
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                self.confirm_again(segment, *version, &refs, *via)
                    .await
                    .is_ok()
            }
            FateWrite::Release {
                version,
                id,
                mode,
                reason,
            } => self
                .release_again(segment, *version, id, *mode, *reason)
                .await
                .is_ok(),
            FateWrite::Sweep => true,
        }
    }

    /// Before `segment`'s master check: sends again every unacknowledged write kept for it.
    /// Returns those answered (forgotten once the check's `WAIT` saw enough replicas, see
    /// [`StockStore::after_check`]); those not answered are kept.
    pub(in crate::stock) async fn resend_unacked(&self, segment: Segment<'_>) -> Vec<FateWrite> {
        let record = self.keys.of(segment).master();
        let writes = self.failover.unacked.take(&record);
        let mut answered = Vec::with_capacity(writes.len());
        let mut kept = Vec::new();
        for write in writes {
            if self.resend(segment, &write).await {
                answered.push(write);
            } else {
                kept.push(write);
            }
        }
        self.failover.unacked.put_back(&record, kept);
        answered
    }

    /// After `segment`'s master check: the writes sent again before it are forgotten when the
    /// check's `WAIT` saw `redis.ack_replicas` replicas (`acknowledged`), else kept.
    pub(in crate::stock) fn after_check(
        &self,
        segment: Segment<'_>,
        answered: Vec<FateWrite>,
        acknowledged: Option<u32>,
    ) {
        if acknowledged.is_some_and(|a| a >= self.ack_replicas) {
            return;
        }
        let record = self.keys.of(segment).master();
        self.failover.unacked.put_back(&record, answered);
    }
}
