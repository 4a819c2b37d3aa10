//! `lua/recount.lua`: an operator's count of a version's remaining stock set in one segment of
//! a store that forgot what it sold. Its keys (in the order the script declares them), its
//! arguments and its reply, in one place; the script itself is in the registry (`super`).

use super::super::records::{int, string};
use super::super::{Layout, ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};
use crate::stock::prelude::*;
use redis::Value;

/// The loss a segment carries, as its `known` hash says (`lua/master.lua`): what a recount
/// settles. Every recount writes a new `recount` stamp, so the stamp a recount read is never
/// carried again once any recount ran there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LossStamp {
    /// `lost`: '<version>|<reason>|<held>|<hw>|<at>', if the segment was found lost.
    pub lost: Option<String>,
    /// `fenced_at`: when a gateway first saw the current fence (Redis ms), if fenced.
    pub fenced_at: Option<String>,
    /// `recount`: '<units>|<at>' of the last recount, if any.
    pub recount: Option<String>,
}

impl LossStamp {
    /// Whether the segment is lost or fenced (a recount has something to settle here).
    pub fn is_loss(&self) -> bool {
        self.lost.is_some() || self.fenced_at.is_some()
    }

    /// Whether the segment's keys were gone (`emptied`, `keys_lost`): whatever its hashes hold
    /// now was lost with them or made again since (by a gateway that never saw the sale).
    pub fn keys_were_gone(&self) -> bool {
        self.lost
            .as_deref()
            .and_then(|l| l.split('|').nth(1))
            .is_some_and(|reason| matches!(reason, "emptied" | "keys_lost"))
    }

    /// The stamp as `recount.lua` compares it: the three fields joined by '/'.
    pub fn stamp(&self) -> String {
        let field = |f: &Option<String>| f.clone().unwrap_or_default();
        format!(
            "{}/{}/{}",
            field(&self.lost),
            field(&self.fenced_at),
            field(&self.recount)
        )
    }
}

impl SegmentKeys {
    /// `recount.lua`: the segment's keys (also the first 13 of `prewarm.lua`'s, in this order).
    pub fn for_recount(&self, version: u64) -> [String; 13] {
        [
            self.meta(),
            self.stock(version),
            self.ledger(version),
            self.pending(version),
            self.users(),
            self.reservations(),
            self.idempotency(),
            self.events(),
            self.transfers(),
            self.received(),
            self.acknowledged(),
            self.known(),
            self.master(),
        ]
    }
}

/// What a recount did in one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentRecount {
    /// The segment sells `remaining` from now; `moved` units went into the ledger's
    /// `recounted` (taken off sale; negative: put on sale); the version went on sale here at
    /// `born` (unix ms).
    Done {
        remaining: u64,
        moved: i64,
        born: u64,
    },
    /// Another version than the one recounted is on sale here (`current`): nothing changed.
    OtherVersion { current: u64 },
    /// A variant's lane whose buyers' units (shared by the activity's variants) are lost: one
    /// variant's records cannot rebuild them; nothing changed.
    SharedUnitsLost,
    /// The segment no longer carries the loss stamp the caller read (`now`: the one it does):
    /// recounted since, or another loss found; nothing changed.
    StampChanged { now: String },
}

impl StockStore {
    /// The loss `segment` carries now (one HMGET of its `known` hash).
    pub(in crate::stock) async fn loss_stamp(
        &self,
        segment: Segment<'_>,
    ) -> Result<LossStamp, StoreError> {
        let (lost, fenced_at, recount) = self
            .query(
                StoreOp::Read,
                redis::cmd("HMGET")
                    .arg(self.keys.of(segment).known())
                    .arg("lost")
                    .arg("fenced_at")
                    .arg("recount"),
            )
            .await?;
        Ok(LossStamp {
            lost,
            fenced_at,
            recount,
        })
    }

    /// Takes the activity-wide claim of a recount of `version` on the losses `stamps` (one per
    /// segment of `layout`, in order), atomically: one key per segment and stamp on the base
    /// tag, all set or none (MSETNX in MULTI/EXEC, with their expiry). `false`: another recount
    /// already claimed one of them (the same loss, read before or while it was settled).
    /// Never sent twice (a retry of a claim whose answer was lost would find its own).
    pub(in crate::stock) async fn claim_recount(
        &self,
        layout: &Layout,
        version: u64,
        stamps: &[String],
        count: u64,
        expire_at: u64,
    ) -> Result<bool, StoreError> {
        let base = self.keys.base(layout);
        let keys: Vec<String> = stamps
            .iter()
            .zip(0u32..)
            .map(|(stamp, index)| base.recount_claim(version, index, stamp))
            .collect();
        let mut pipe = redis::pipe();
        pipe.atomic();
        let set = pipe.cmd("MSETNX");
        for key in &keys {
            set.arg(key).arg(count);
        }
        for key in &keys {
            pipe.cmd("EXPIREAT").arg(key).arg(expire_at).ignore();
        }
        let (taken,): (i64,) = self
            .redis
            .pipeline(StoreOp::Recount, self.timeout(), &pipe, None)
            .await?;
        Ok(taken == 1)
    }

    /// Sets `version`'s remaining stock in `segment` to `units` (see `lua/recount.lua`); `share`
    /// is the segment's configured share (a ledger made again starts from it), `count` the
    /// operator's count for the whole activity (recorded), `stamp` the loss stamp the caller
    /// read there ([`LossStamp::stamp`]): refused if the segment carries another now.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::stock) async fn recount_segment(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        share: u64,
        count: u64,
        stamp: &str,
        expire_at: u64,
    ) -> Result<SegmentRecount, StoreError> {
        let keys = self.keys.of(segment);
        let others: Vec<u64> = self
            .meta(segment)
            .await?
            .versions
            .into_iter()
            .filter(|&v| v != version)
            .collect();
        let mut invocation = super::RECOUNT.prepare_invoke();
        for key in keys.for_recount(version) {
            invocation.key(key);
        }
        for &other in &others {
            invocation.key(keys.ledger(other));
        }
        invocation
            .arg(version)
            .arg(units)
            .arg(share)
            .arg(expire_at)
            .arg(self.events_maxlen)
            .arg(count)
            .arg(self.failover.watermark(&keys.master()).seen().1)
            .arg(stamp);
        for other in others {
            invocation.arg(other);
        }
        let reply: Vec<Value> = self
            .eval(ScriptName::Recount, StoreOp::Recount, &invocation)
            .await?;
        let other = || {
            string(reply.get(1))
                .and_then(|c| c.parse().ok())
                .map(|current| SegmentRecount::OtherVersion { current })
        };
        let outcome = match int(reply.first()) {
            Some(1) => match (int(reply.get(2)), int(reply.get(3)), int(reply.get(4))) {
                (Some(remaining), Some(moved), Some(born)) => Some(SegmentRecount::Done {
                    remaining: remaining.max(0) as u64,
                    moved,
                    born: born.max(0) as u64,
                }),
                _ => None,
            },
            Some(-2 | -3) => other(),
            Some(-4) => Some(SegmentRecount::SharedUnitsLost),
            Some(-5) => string(reply.get(1)).map(|now| SegmentRecount::StampChanged { now }),
            _ => None,
        };
        outcome.ok_or_else(|| StoreError::protocol(ScriptName::Recount, reply))
    }
}
