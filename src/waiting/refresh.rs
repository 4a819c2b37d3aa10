//! Each gateway's reading of every configured queue's state from Redis (the cursor, the hold,
//! the halt): one script call per queue every [`super::REFRESH_INTERVAL`], whatever the number
//! of buyers; polls and admissions are then answered from memory.

use super::store::{self, QueueStore, Rewrite};
use super::view::View;
use super::WaitingRoom;
use crate::config::{Activity, QueueSettings, Settings};
use crate::stock::StoreError;

impl<S: QueueStore> WaitingRoom<S> {
    /// Reads every configured queue's state (each gateway every [`REFRESH_INTERVAL`]: one
    /// script call per queue, whatever the number of buyers).
    pub async fn refresh(&self, settings: &Settings) {
        for activity in settings.activities.iter() {
            let Some(queue) = &activity.queue else {
                continue;
            };
            // What this process was reloaded with is written until a write succeeds.
            let now = Configured::of(activity, queue);
            let rewrite = {
                let mut configured = self.configured.write();
                let entry = configured.entry(activity.id.clone()).or_insert(now);
                entry.reloaded(now);
                entry.rewrite
            };
            match self.read(activity, queue, rewrite).await {
                Ok(()) if rewrite != Rewrite::default() => {
                    if let Some(entry) = self.configured.write().get_mut(&activity.id) {
                        entry.written(now);
                    }
                }
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(activity = %activity.id, error = %e, "queue state not read");
                }
            }
        }
    }

    /// A reload was applied: each queue's configured start is written at its next read (an
    /// earlier one applied only while nobody holds a ticket, see `queue_reschedule`).
    pub fn reloaded(&self) {
        self.configured
            .write()
            .values_mut()
            .for_each(Configured::reload);
    }

    pub(super) async fn read(
        &self,
        activity: &Activity,
        queue: &QueueSettings,
        rewrite: Rewrite,
    ) -> Result<(), StoreError> {
        // A segmented activity's units are in other slots: summed here, fresh on every read (one
        // ledger read per segment), so that no gateway holds or frees the cursor on an old sum.
        let known = if activity.has_variants() {
            self.variants_left(activity).await
        } else if activity.is_segmented() {
            self.segmented_left(activity).await
        } else {
            None
        };
        let (state, left) = self
            .store
            .state(activity, queue, &store::Fresh::random(), rewrite, known)
            .await?;
        self.learn(activity, View::new(state, left).of_stock(activity.stock));
        Ok(())
    }

    /// Units of the configured version left over a segmented activity's segments (stock plus
    /// units in flight between them), read now; `None` when a segment cannot say (not
    /// prewarmed, a newer version on sale there, a failed read): then the queue's hold is left
    /// as it is, never set on a guess.
    async fn segmented_left(&self, activity: &Activity) -> Option<i64> {
        self.layout_left(&crate::stock::Layout::of(activity), activity.version)
            .await
    }

    /// Units of the configured version left over every variant of an activity with variants
    /// (each its own stock lane, its units summed as a segmented activity's are); each
    /// variant's is kept for the polls' list. `None` when a variant cannot say.
    async fn variants_left(&self, activity: &Activity) -> Option<i64> {
        let mut total = Some(0);
        for v in activity.variants.iter() {
            let layout = crate::stock::Layout::of(activity).for_variant(v.id.clone());
            let left = self.layout_left(&layout, activity.version).await;
            if let Some(left) = left {
                self.variant_left
                    .write()
                    .insert(layout.lane().clone(), left);
            }
            total = total.zip(left).map(|(t, l)| t + l);
        }
        total
    }

    /// Units of `version` left over `layout`'s segments, read now.
    async fn layout_left(&self, layout: &crate::stock::Layout, version: u64) -> Option<i64> {
        let reads = layout.segments().map(|p| self.store.ledger(p, version));
        let mut total = 0;
        for row in futures_util::future::join_all(reads).await {
            let row = row.ok()?;
            if !row.stock_key {
                return None;
            }
            total += row.available();
        }
        Some(total)
    }
}

/// A queue's rate and start as this process was last configured, and what of them a reload
/// changed and is still to be written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Configured {
    rate: u32,
    start_ms: i64,
    rewrite: Rewrite,
}

impl Configured {
    /// As `activity` has them (nothing to write: the first configuration seen is Redis's to
    /// keep, or to take at its setup).
    fn of(activity: &Activity, queue: &QueueSettings) -> Configured {
        Configured {
            rate: queue.admit_per_second,
            start_ms: store::start_ms(activity),
            rewrite: Rewrite::default(),
        }
    }

    /// A configuration seen now: what differs from the last one is to be written.
    fn reloaded(&mut self, now: Configured) {
        if now.rate != self.rate {
            self.rate = now.rate;
            self.rewrite.rate = true;
        }
        if now.start_ms != self.start_ms {
            self.start_ms = now.start_ms;
            self.rewrite.start = true;
        }
    }

    /// A reload applied: its start is written even if unchanged here (this process may have
    /// started with it: a restart moves no start earlier, the reload that follows does).
    fn reload(&mut self) {
        self.rewrite.advance = true;
    }

    /// A write of `then` succeeded: what still matches it is written.
    fn written(&mut self, then: Configured) {
        if self.rate == then.rate {
            self.rewrite.rate = false;
        }
        if self.start_ms == then.start_ms {
            self.rewrite.start = false;
            self.rewrite.advance = false;
        }
    }
}
