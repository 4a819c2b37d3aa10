//! `lua/prewarm.lua`: put a version on sale in one segment (create once, never reset; retire
//! older ones). Its keys (in the order the script declares them), its arguments and its reply, in
//! one place; the script itself is in the registry (`super`).

use super::super::records::{int, string};
use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};
use crate::stock::prelude::*;
use redis::Value;

impl SegmentKeys {
    /// `prewarm.lua`: the segment's keys, then stock, ledger and pending of each of `others`.
    pub fn for_prewarm(&self, version: u64, others: &[u64]) -> Vec<String> {
        let mut keys = self.for_recount(version).to_vec();
        for &v in others {
            keys.extend([self.stock(v), self.ledger(v), self.pending(v)]);
        }
        // Last, only to have its expiry moved with the others' (the restock call makes it).
        keys.push(self.restocks());
        keys
    }
}

/// How many times prewarm reads a segment's meta again when it changed under it.
const PREWARM_ATTEMPTS: usize = 4;

/// When the version went on sale in a segment, and when the segment was last recounted (unix
/// ms, Redis's clock; 0 when it does not say, or never): a gateway that saw the version on sale
/// remembers its birth, and another one is a loss unless a recount made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Birth {
    pub born: u64,
    pub recounted: u64,
    /// Created just now after its sale opened, in a segment that had nothing on sale: born on
    /// hold (sells once the hold passed and no gateway that saw it sell objected, see
    /// `lua/prewarm.lua`).
    pub on_hold: bool,
}

/// What prewarm found in one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrewarmOutcome {
    /// The version went on sale here now (the one before it, if any, retired).
    /// (at `Birth`.)
    Created(Birth),
    /// The version is on sale here (since `Birth`).
    Exists(Birth),
    /// A key the segment had is gone (a placeholder, the event stream, the ledger on sale, or
    /// the meta while anything else remains): the per-user limit, the records or the versions
    /// to sweep can no longer be trusted.
    Damaged,
    /// The version is on sale here but its stock key is gone (removed by hand, or lost): it is
    /// not re-created, since that would put sold units on sale again.
    StockKeyRemoved,
    /// A newer version is on sale here.
    Older { current: u64 },
    /// The segment holds less than was sold: it is marked lost (`lua/master.lua`), or the
    /// version would be created although this process saw it on sale. Never created: only a
    /// recount or a newer version sells here again.
    Lost,
}

/// What is known of a segment before it is prewarmed (see [`StockStore::prewarm`]).
#[derive(Debug, Clone, Copy)]
pub struct Past {
    /// The activity's base meta records the segment as made before.
    pub made_before: bool,
    /// This process saw the version on sale (it is never created again).
    pub seen_on_sale: bool,
    /// Its buyers' units and idempotency keys are shared with other lanes.
    pub shared: SharedKeys,
    /// When the sale opens (unix ms, Redis's clock; `i64::MIN`: no bound): a version created at
    /// or after it, in a segment that had none on sale, is born on hold.
    pub opens_ms: i64,
}

/// Whether a segment's buyers' units and idempotency keys are shared with other stock lanes
/// (the variants of a drop, see `stock::layout`), and whether one of those was on sale before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedKeys {
    /// An activity without variants: the segment's own.
    No,
    /// A variant's lane, no other variant of the activity put on sale yet: they may be made.
    First,
    /// A variant's lane after another variant was put on sale: they must be there (gone, they
    /// are lost, never made again).
    AfterSiblings,
}

impl StockStore {
    /// Puts `version` on sale in one segment with `units`, once (retiring the version before
    /// it), and moves every key's expiry to `expire_at` if that is later. `made_before`: the
    /// activity's base meta records the segment as made (a segment then found empty lost
    /// everything, and is refused as damaged). `seen_on_sale`: this process saw the version on
    /// sale (it is never created again). With the outcome, when the segment was last recounted
    /// as the script read it (unix ms, 0 never).
    pub async fn prewarm(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        expire_at: u64,
        past: Past,
    ) -> Result<(PrewarmOutcome, u64), StoreError> {
        let Past {
            made_before,
            seen_on_sale,
            shared,
            opens_ms,
        } = past;
        let mut meta = self.meta(segment).await?;
        let (hold, hold_under_uptime) = self.birth_hold_for(meta.current).await?;
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
            let mut invocation = super::PREWARM.prepare_invoke();
            for key in self.keys.of(segment).for_prewarm(version, &others) {
                invocation.key(key);
            }
            invocation
                .arg(version)
                .arg(meta.current.map(|c| c.to_string()).unwrap_or_default())
                .arg(units)
                .arg(expire_at)
                .arg(if made_before { "1" } else { "0" })
                .arg(if seen_on_sale { "1" } else { "0" })
                .arg(
                    self.failover
                        .watermark(&self.keys.of(segment).master())
                        .seen()
                        .1,
                )
                .arg(match shared {
                    SharedKeys::No => "0",
                    SharedKeys::First => "1",
                    SharedKeys::AfterSiblings => "2",
                })
                .arg(if opens_ms == i64::MIN {
                    String::new()
                } else {
                    opens_ms.max(0).to_string()
                })
                .arg(hold)
                .arg(&hold_under_uptime);
            for v in &others {
                invocation.arg(*v);
            }
            let reply: Vec<Value> = self
                .eval(ScriptName::Prewarm, StoreOp::Prewarm, &invocation)
                .await?;
            match outcome_of(&reply) {
                Some(Some(outcome)) => return Ok(outcome),
                // What is on sale changed since it was read: read again.
                Some(None) => meta = self.meta(segment).await?,
                None => return Err(StoreError::protocol(ScriptName::Prewarm, reply)),
            }
        }
        Err(StoreError::protocol(
            ScriptName::Prewarm,
            "what is on sale kept changing while prewarming",
        ))
    }

    /// The birth hold to ask for (ms; 0 none) and the uptime (s; '' any) under which Redis must
    /// be for it to apply: it only matters where a version may be created in a segment that has
    /// none on sale (`current`), and only while another gateway may be alive to object: one is
    /// seen, or Redis started too recently for every one to be seen again (see
    /// [`StockStore::other_gateways_alive`] and `lua/prewarm.lua`).
    async fn birth_hold_for(&self, current: Option<u64>) -> Result<(u64, String), StoreError> {
        if self.birth_hold.is_zero() || current.is_some() {
            return Ok((0, String::new()));
        }
        let hold = self.birth_hold.as_millis() as u64;
        if self.other_gateways_alive().await? {
            return Ok((hold, String::new()));
        }
        if self.presence_return.is_zero() {
            return Ok((0, String::new()));
        }
        Ok((hold, self.presence_return.as_secs().max(1).to_string()))
    }
}

/// The script's reply: the outcome and when the segment was last recounted; `Some(None)` when
/// what is on sale changed since the caller read it (-3); `None` for a reply it cannot read.
fn outcome_of(reply: &[Value]) -> Option<Option<(PrewarmOutcome, u64)>> {
    let current = string(reply.get(1)).and_then(|c| c.parse::<u64>().ok());
    let ms = |i: usize| int(reply.get(i)).map_or(0, |b| b.max(0) as u64);
    let birth = Birth {
        born: ms(2),
        recounted: ms(3),
        on_hold: string(reply.get(4)).as_deref() == Some("1"),
    };
    let outcome = match int(reply.first())? {
        1 => PrewarmOutcome::Created(birth),
        0 => PrewarmOutcome::Exists(birth),
        -4 => PrewarmOutcome::Damaged,
        -5 => PrewarmOutcome::Lost,
        -1 => PrewarmOutcome::StockKeyRemoved,
        -2 => PrewarmOutcome::Older {
            current: current.unwrap_or(0),
        },
        -3 => return Some(None),
        _ => return None,
    };
    Some(Some((outcome, birth.recounted)))
}
