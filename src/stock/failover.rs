//! The failover fence: a Redis master replaced under flashgate (a replica promoted, a master
//! restarted under a new replication id after losing its last writes under `everysec`) may lack
//! reservations the old one acknowledged: its stock is too high by them, and selling from it
//! sells those units twice. So each segment records, beside its stock, the identity of the master
//! its stock was accepted under (`<tag>:master` = INFO replication's `master_replid`), and the
//! reserve script compares it with the master it runs on before taking anything
//! (`master_holds`, lua/lib.lua): a fenced segment takes no reservation on the new master, from
//! its first call, whichever gateway asks. The activity answers `unavailable` (503) until an
//! operator checks the backend's orders (`flashgate reconcile --orders`) and accepts the new
//! master (`POST /v1/activities/{act}/resume`, [`StockStore::accept_master`]).
//!
//! Where the identity lives: in Redis, beside the stock (so it is replicated with the stock: a
//! promoted replica holds the old master's identity, not its own; a gateway started after the
//! promotion, with nothing in memory, still sees the difference), AND in each gateway's memory
//! (what it last saw accepted per segment: if the record itself was lost with the data, a
//! gateway that saw the old master still refuses the new one). Only the record decides while it
//! exists; an operator's accept rewrites it, and every gateway follows within one check.
//! Approximation: a master that lost its data entirely, seen by no running gateway, is accepted
//! (nothing remembers the old one); the lost-key checks (prewarm's floor, `Damaged`) cover that.
//!
//! Every gateway checks every configured activity's segments each [`CHECK_INTERVAL`] (one
//! script call per segment: INFO and a GET), for the gauge `flashgate_activity_fenced`, the
//! admin view, and to answer `unavailable` without asking Redis.

use super::scripts::master::Verdict;
use super::{Layout, StockStore, StoreError};
use crate::config::Activity;
use parking_lot::RwLock;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How often each gateway checks each activity's masters: a promoted replica is fenced in the
/// gauge and the admin view within this (its first reserve is refused at once, in Redis).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Why an activity is fenced: a segment's recorded master and the one answering now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fence {
    pub segment: u32,
    /// The identity recorded beside the stock ('' if none: the gateway remembered another).
    pub recorded: String,
    /// The identity of the master answering now.
    pub current: String,
}

/// What this process knows of the masters (see the module doc).
#[derive(Default)]
pub struct Failover {
    /// The identity last seen accepted, per master record (one per segment).
    seen: RwLock<HashMap<String, String>>,
    /// Master records found fenced (by a check or a reserve), until accepted.
    fenced: RwLock<HashSet<String>>,
    /// The fenced activities, with why (by the last check).
    fences: RwLock<HashMap<Arc<str>, Fence>>,
    /// Accepts made by this process: a check that read the record before an accept and ends
    /// after it says nothing (it would fence again what was just accepted).
    accepts: std::sync::atomic::AtomicU64,
}

impl Failover {
    /// The identity this process last saw accepted under `record` ('' if none).
    pub(super) fn expected(&self, record: &str) -> String {
        self.seen.read().get(record).cloned().unwrap_or_default()
    }

    /// A reserve under `record` was refused by the fence.
    pub(super) fn saw_fenced(&self, record: &str) {
        self.fenced.write().insert(record.to_owned());
    }

    fn accepts(&self) -> u64 {
        self.accepts.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn saw(&self, record: &str, verdict: &Verdict, accepts_before: u64) {
        if self.accepts() != accepts_before {
            return;
        }
        match verdict.verdict.as_str() {
            "fenced" => {
                self.fenced.write().insert(record.to_owned());
            }
            _ => {
                self.seen
                    .write()
                    .insert(record.to_owned(), verdict.current.clone());
                self.fenced.write().remove(record);
            }
        }
    }

    /// Why `activity` is fenced, if it is.
    pub fn fence(&self, activity: &str) -> Option<Fence> {
        self.fences.read().get(activity).cloned()
    }
}

impl StockStore {
    /// This process's knowledge of the masters.
    pub fn failover(&self) -> &Failover {
        &self.failover
    }

    /// Whether `activity` is fenced: a check or a reserve found one of its segments on another
    /// master than the one its stock was accepted under.
    pub fn is_fenced(&self, activity: &Activity) -> bool {
        let fenced = self.failover.fenced.read();
        if fenced.is_empty() {
            return false;
        }
        Layout::of(activity)
            .segments()
            .any(|s| fenced.contains(&self.keys.of(s).master()))
    }

    /// Checks every segment of `activity` (each gateway, every [`CHECK_INTERVAL`]): the gauge
    /// and the admin view follow. Returns the fence, if any.
    pub async fn check_master(&self, activity: &Activity) -> Result<Option<Fence>, StoreError> {
        let accepts = self.failover.accepts();
        let mut fence = None;
        for segment in Layout::of(activity).segments() {
            let record = self.keys.of(segment).master();
            let verdict = self
                .master(&record, self.failover.expected(&record), activity, false)
                .await?;
            self.failover.saw(&record, &verdict, accepts);
            if verdict.verdict == "fenced" && fence.is_none() {
                fence = Some(Fence {
                    segment: segment.index(),
                    recorded: verdict.recorded,
                    current: verdict.current,
                });
            }
        }
        if self.failover.accepts() == accepts {
            self.show(activity, fence.clone());
        }
        Ok(fence)
    }

    /// Accepts the masters answering now for every segment of `activity` (an operator's
    /// resume, once the backend's orders were reconciled): it sells again, on every gateway
    /// within one check.
    pub async fn accept_master(&self, activity: &Activity) -> Result<(), StoreError> {
        for segment in Layout::of(activity).segments() {
            let record = self.keys.of(segment).master();
            let verdict = self
                .master(&record, self.failover.expected(&record), activity, true)
                .await?;
            // Checks that read before this accept say nothing after it.
            let accepts = self
                .failover
                .accepts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            if verdict.recorded != verdict.current {
                tracing::warn!(activity = %activity.id, segment = segment.index(),
                    previous = %verdict.recorded, now = %verdict.current,
                    "the new Redis master was accepted: the activity sells again");
            }
            self.failover.saw(&record, &verdict, accepts);
        }
        self.show(activity, None);
        Ok(())
    }

    fn show(&self, activity: &Activity, fence: Option<Fence>) {
        let mut fences = self.failover.fences.write();
        match fence {
            Some(fence) => {
                if !fences.contains_key(&activity.id) {
                    tracing::error!(activity = %activity.id, segment = fence.segment,
                        recorded = %fence.recorded, current = %fence.current,
                        "Redis master changed under the activity (failover or restart): fenced, \
                         not selling until reconciled and resumed");
                }
                fences.insert(activity.id.clone(), fence);
            }
            None => {
                fences.remove(&activity.id);
            }
        }
        self.redis
            .metrics()
            .activity_fenced
            .with_label_values(&[&activity.id])
            .set(i64::from(fences.contains_key(&activity.id)));
    }
}
