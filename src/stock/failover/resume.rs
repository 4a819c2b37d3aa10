//! An operator's resume of a fence (`POST .../resume` with no count): the masters answering now
//! accepted for every segment, once nothing is lost, the backend's orders were found whole
//! since the fence began, and the fence stood its settle window (every live gateway has written
//! back what it saw by then); and, after a recount, the masters the recount recorded.

use super::{Fence, LiftReason, MasterCall};
use crate::config::Activity;
use crate::stock::{Layout, StockStore, StoreError};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a plain resume found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumed {
    /// Every segment's master accepted.
    Accepted,
    /// A segment holds less than was sold: nothing accepted (a recount is needed).
    Lost(Fence),
    /// A segment is fenced and `flashgate reconcile --orders` has not found the backend's
    /// orders whole since the fence began: nothing accepted (run it, or resume with a count).
    Unchecked(Fence),
}

impl StockStore {
    /// Checks every segment of `layout`: the indexes of those fenced, or the first one lost
    /// (shown; a plain resume is refused).
    async fn check_all(
        &self,
        activity: &Activity,
        layout: &Layout,
    ) -> Result<Result<Vec<u32>, Fence>, StoreError> {
        let mut fenced = Vec::new();
        for segment in layout.segments() {
            let verdict = self
                .master_call(segment, activity, MasterCall::Check)
                .await?;
            if verdict.verdict == "lost" {
                let fence = self.fence_of(segment, &verdict);
                self.show(activity, Some(fence.clone()));
                return Ok(Err(fence));
            }
            if verdict.verdict == "fenced" {
                fenced.push(segment.index());
            }
        }
        Ok(Ok(fenced))
    }

    /// Accepts the masters answering now for every segment of `activity` (an operator's
    /// resume, once the backend's orders were reconciled): it sells again, on every gateway
    /// within one check. Refused, with nothing accepted, while a segment is lost. The segments
    /// are the ones Redis recorded (a configuration with another count sells nothing anyway).
    pub async fn accept_master(&self, activity: &Activity) -> Result<Resumed, StoreError> {
        let layout = crate::stock::segments::recorded_layout(self, activity).await?;
        let fenced = match self.check_all(activity, &layout).await? {
            Ok(fenced) => fenced,
            Err(lost) => return Ok(Resumed::Lost(lost)),
        };
        // In doubt, hold: a configured layout Redis no longer records (another gateway's
        // change, the registry outliving an emptied store) may hold segments this gateway saw
        // sell; one whose records are gone is lost too, and refuses the plain resume.
        let configured = Layout::of(activity);
        if configured.count() != layout.count() {
            if let Err(lost) = self.check_all(activity, &configured).await? {
                return Ok(Resumed::Lost(lost));
            }
        }
        let mut changed = false;
        for segment in layout.segments() {
            let record = self.keys.of(segment).master();
            if fenced.contains(&segment.index()) {
                // In doubt, hold: what is pending under the fence may be a sale the replaced
                // master confirmed; its expiry proves nothing (held before the accept: a sweep
                // runs again once the fence is gone).
                self.hold_pending_in_doubt(activity, segment).await?;
            }
            // A fence younger than its settle window is accepted once it stood that long:
            // every live gateway has written back what it saw by then (lua/master.lua).
            let mut verdict;
            loop {
                let seen = self.seen(segment, activity, true).await;
                verdict = self
                    .master(segment, activity, &seen, MasterCall::Accept, false)
                    .await?;
                if verdict.verdict != "settling" {
                    break;
                }
                let left = verdict
                    .detail
                    .parse::<u64>()
                    .unwrap_or(0)
                    .min(u64::try_from(self.fence_settle.as_millis()).unwrap_or(u64::MAX));
                tokio::time::sleep(Duration::from_millis(left + 10)).await;
            }
            // Checks that read before this accept say nothing after it.
            let accepts = self.failover.accepts.fetch_add(1, Ordering::SeqCst) + 1;
            if verdict.verdict == "lost" {
                let fence = self.fence_of(segment, &verdict);
                self.show(activity, Some(fence.clone()));
                return Ok(Resumed::Lost(fence));
            }
            if verdict.verdict == "unchecked" {
                let fence = self.fence_of(segment, &verdict);
                self.show(activity, Some(fence.clone()));
                return Ok(Resumed::Unchecked(fence));
            }
            if verdict.recorded != verdict.current {
                changed = true;
                tracing::warn!(activity = %activity.id, segment = segment.index(),
                    previous = %verdict.recorded, now = %verdict.current,
                    "the new Redis master was accepted: the activity sells again");
            }
            self.failover.saw(&record, &verdict, accepts);
        }
        if changed {
            self.lifted(activity, LiftReason::Resume);
        }
        self.show(activity, None);
        Ok(Resumed::Accepted)
    }

    /// After a recount: every segment's record now names the master answering (recount.lua).
    pub(in crate::stock) fn recounted(&self, activity: &Activity) {
        self.failover.accepts.fetch_add(1, Ordering::SeqCst);
        let mut fenced = self.failover.fenced.write();
        for segment in Layout::of(activity).segments() {
            fenced.remove(&self.keys.of(segment).master());
        }
        drop(fenced);
        self.lifted(activity, LiftReason::Recount);
        self.show(activity, None);
    }
}
