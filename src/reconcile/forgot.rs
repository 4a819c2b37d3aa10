//! Whether the store forgot what it sold: a check `reconcile` makes beside the ledgers, which
//! balance however much Redis lost (an emptied or older store is consistent with itself). Per
//! segment, from what the gateways wrote back beside it (`<tag>:known`, see `stock::failover`)
//! and from the activity's own records of what was on sale (its floor, its metas):
//! - LOST: a gateway found the segment holding less than was sold (and marked it);
//! - BEHIND: it holds fewer reservation records than a gateway saw it hold;
//! - DAMAGED: its records or users hash lost its placeholder (so maybe entries too);
//! - MISSING: keys of what was on sale are gone before the sale's keys were due to expire: the
//!   segment's meta (its floor, or for a segment of a split activity the base meta's record
//!   that it was made, says it existed), or the ledger or stock key of the version its meta
//!   says is on sale (read in the same transaction as the meta, so a version being retired
//!   meanwhile is never taken for a loss).
//!
//! A store that lost data while no running gateway had seen it, with its floor gone too, cannot
//! be told from a new one here: the backend's orders can (`reconcile --orders`).

use crate::config::Activity;
use crate::stock::failover::known::Known;
use crate::stock::prelude::*;
use crate::stock::{Snapshot, StockStore, StoreError};
use std::sync::Arc;

/// One thing the store lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    pub activity: Arc<str>,
    pub segment: u32,
    pub what: String,
}

/// What the activity's own records say was on sale, read before its segments' snapshots (so
/// that a segment being made just then is never taken for a lost one).
pub struct Context {
    activity: Arc<str>,
    /// `activity` and its variant, as the table names the lane (`2001 variant=42`).
    label: Arc<str>,
    /// What a recount of the lane adds to `{"remaining": N}` (`, "variant": "42"`).
    recount_extra: String,
    /// The newest version claimed (the floor, or the base meta's newer claim).
    claimed: Option<u64>,
    /// Segments the base meta of a split activity records as made.
    made: Vec<u32>,
    segmented: bool,
    /// Redis's clock is before the sale's keys are due to expire.
    before_expiry: bool,
}

impl Context {
    pub async fn read(
        store: &StockStore,
        activity: &Activity,
        segmented: bool,
    ) -> Result<Context, StoreError> {
        store.read_clock().await?;
        let base = store.base_meta(&activity.lane).await?;
        let (label, recount_extra) = match &activity.variant {
            Some(v) => (
                Arc::from(format!("{} variant={v}", activity.id)),
                format!(", \"variant\": \"{v}\""),
            ),
            None => (activity.id.clone(), String::new()),
        };
        Ok(Context {
            activity: activity.id.clone(),
            label,
            recount_extra,
            claimed: store.floor(&activity.lane).await?.max(base.newest),
            made: base.made,
            segmented,
            before_expiry: store.clock().now().timestamp() < store.expire_at(activity) as i64,
        })
    }

    /// What segment `index` lacks, from its snapshot and what the gateways know of it.
    pub fn judge(&self, index: u32, snapshot: &Snapshot, known: &Known) -> Option<Forgotten> {
        let what = if let Some((reason, at)) = &known.lost {
            format!(
                "LOST ({reason}, found {}): Redis holds {} reservation records, the gateways saw \
                 {} (behind by {}); nothing sells until POST /v1/activities/{}/resume with \
                 {{\"remaining\": N{}}}, N the stock less the backend's orders (reconcile --orders)",
                at_text(*at),
                known.held,
                known.seen,
                known.behind_by(),
                self.activity,
                self.recount_extra
            )
        } else if known.behind_by() > 0 {
            format!(
                "BEHIND: Redis holds {} reservation records, the gateways saw {}: it forgot {} \
                 they acknowledged",
                known.held,
                known.seen,
                known.behind_by()
            )
        } else if !known.unmarked.is_empty() {
            format!(
                "DAMAGED: its {} hash lost its placeholder (evicted, deleted or edited by hand): \
                 its entries cannot be trusted; nothing sells here until POST \
                 /v1/activities/{}/resume with {{\"remaining\": N{}}} counts them again",
                known.unmarked.join(" and "),
                self.activity,
                self.recount_extra
            )
        } else {
            format!(
                "MISSING: {} is gone (emptied, flushed, evicted or deleted) before the sale's keys \
                 were due to expire",
                self.missing(index, snapshot)?
            )
        };
        Some(Forgotten {
            activity: self.label.clone(),
            segment: index,
            what,
        })
    }

    /// The key of what was on sale that segment `index` lacks, if any.
    fn missing(&self, index: u32, snapshot: &Snapshot) -> Option<String> {
        if !self.before_expiry {
            return None;
        }
        let Some(current) = snapshot.current else {
            let made = if self.segmented {
                self.made.contains(&index)
            } else {
                self.claimed.is_some()
            };
            return (made && !snapshot.meta_exists)
                .then(|| "the segment's meta (the versions on sale)".to_owned());
        };
        let row = snapshot.ledgers.iter().find(|l| l.version == current)?;
        if !row.ledger {
            Some(format!("the ledger of version {current}, on sale"))
        } else if !row.stock_key {
            Some(format!("the stock key of version {current}, on sale"))
        } else {
            None
        }
    }
}

fn at_text(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}
