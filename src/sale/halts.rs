//! Which activities are halted for the whole fleet, as this gateway last read them from Redis
//! (every gateway reads every activity's halt every 100 ms: `crate::lifecycle::halt`).

use crate::stock::Halt;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The activities this gateway knows halted, with since when (unix ms, Redis's clock), and
/// whether every activity's halt was read at least once (readiness waits for it, so a gateway
/// started during a halt never sells before it knows).
#[derive(Default)]
pub(super) struct Halts(ArcSwap<HashMap<Arc<str>, u64>>, AtomicBool);

impl Halts {
    /// Whether every configured activity's halt was read once.
    pub fn read_once(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }

    /// Every configured activity's halt was read once.
    pub(super) fn mark_read(&self) {
        self.1.store(true, Ordering::Relaxed);
    }

    /// Since when the activity is halted, if it is.
    pub fn since(&self, activity: &str) -> Option<u64> {
        self.0.load().get(activity).copied()
    }

    /// Records what Redis said; whether that changed what this gateway knew.
    pub(super) fn set(&self, activity: &Arc<str>, halt: Halt) -> bool {
        let known = self.since(activity);
        let now = match halt {
            Halt::Since(since) => Some(since),
            Halt::Running => None,
        };
        if known.is_some() == now.is_some() {
            return false;
        }
        self.0.rcu(|map| {
            let mut map = HashMap::clone(map);
            match now {
                Some(since) => map.insert(activity.clone(), since),
                None => map.remove(activity),
            };
            map
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halts_change_once_per_change() {
        let halts = Halts::default();
        let act: Arc<str> = Arc::from("1001");
        assert_eq!(halts.since("1001"), None);
        assert!(halts.set(&act, Halt::Since(5)));
        assert!(!halts.set(&act, Halt::Since(5)));
        assert_eq!(halts.since("1001"), Some(5));
        assert!(halts.set(&act, Halt::Running));
        assert!(!halts.set(&act, Halt::Running));
        assert_eq!(halts.since("1001"), None);
    }
}
