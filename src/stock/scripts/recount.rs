//! `lua/recount.lua`: an operator's count of a version's remaining stock set in one segment of
//! a store that forgot what it sold. Its keys (in the order the script declares them), its
//! arguments and its reply, in one place; the script itself is in the registry (`super`).

use super::super::records::{int, string};
use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};
use redis::Value;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl StockStore {
    /// Sets `version`'s remaining stock in `segment` to `units` (see `lua/recount.lua`); `share`
    /// is the segment's configured share (a ledger made again starts from it), `count` the
    /// operator's count for the whole activity (recorded).
    pub(in crate::stock) async fn recount_segment(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        share: u64,
        count: u64,
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
            .arg(self.failover.watermark(&keys.master()).seen().1);
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
            _ => None,
        };
        outcome.ok_or_else(|| StoreError::protocol(ScriptName::Recount, reply))
    }
}
