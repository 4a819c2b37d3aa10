//! Activities this instance will not sell because Redis's record of them refuses their
//! configuration (segments changed, a version older than one already on sale, keys of an older
//! layout): learned by prewarm, answered `unavailable` at once instead of asking Redis again for
//! every buyer. The refusal is Redis's; this is only the instance's memory of it, rebuilt by every
//! prewarm tick (so fixing the YAML puts the activity back on sale within one tick, or at once on
//! a reload, which forgets every refusal).

use crate::stock::segments::Refusal;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
pub struct Refusals(ArcSwap<HashMap<Arc<str>, Refusal>>);

impl Refusals {
    /// Whether (and why) the stock lane (`Activity::lane`: an activity, or one variant of it)
    /// is refused.
    pub fn get(&self, activity: &str) -> Option<Refusal> {
        self.0.load().get(activity).cloned()
    }

    /// Whether the activity, as configured now, is refused (a refusal of another version or
    /// segment count does not apply).
    pub fn is_refused(&self, activity: &crate::config::Activity) -> bool {
        self.0
            .load()
            .get(&activity.lane)
            .is_some_and(|r| r.applies_to(activity))
    }

    /// Whether any stock lane of activity `id` (itself, or `<id>~<variant>`) is refused.
    pub fn any_lane_of(&self, id: &str) -> bool {
        self.0.load().keys().any(|lane| {
            lane.strip_prefix(id)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('~'))
        })
    }

    /// Records (or clears, with `None`) the refusal of one stock lane.
    pub fn set(&self, activity: &Arc<str>, refusal: Option<Refusal>) {
        self.0.rcu(|map| {
            let mut map = HashMap::clone(map);
            match &refusal {
                Some(r) => map.insert(activity.clone(), r.clone()),
                None => map.remove(activity),
            };
            map
        });
    }

    /// Forgets every refusal (a reload: the next prewarm decides again).
    pub fn clear(&self) {
        self.0.store(Arc::default());
    }
}
