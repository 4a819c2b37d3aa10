//! Local "sold out" pre-check (moka): once this instance learns that an activity's current stock
//! version is at zero, it answers `sold_out` without calling Redis until the entry expires.
//!
//! Approximation: the entry lives for `sold_out_cache.ttl_ms`. If units come back meanwhile (a
//! release on another instance, a restock by version bump is a different key and not affected),
//! this instance keeps answering `sold_out` for at most that long. Releases made by this
//! instance clear the entry at once.

use arc_swap::ArcSwap;
use moka::sync::Cache;
use std::sync::Arc;
use std::time::Duration;

/// Upper bound on entries: activities × versions in flight; far above any real config.
const MAX_ENTRIES: u64 = 10_000;

type Entries = Cache<(Arc<str>, u64), ()>;

pub struct SoldOutCache {
    entries: ArcSwap<Entries>,
    ttl: ArcSwap<Duration>,
}

fn entries(ttl: Duration) -> Entries {
    Cache::builder()
        .max_capacity(MAX_ENTRIES)
        .time_to_live(ttl)
        .build()
}

impl SoldOutCache {
    pub fn new(ttl: Duration) -> Self {
        SoldOutCache {
            entries: ArcSwap::from_pointee(entries(ttl)),
            ttl: ArcSwap::from_pointee(ttl),
        }
    }

    /// A new TTL (a reload) starts an empty cache: marks are only a shortcut, and the next
    /// buyer of a sold-out activity learns it again from Redis.
    pub fn set_ttl(&self, ttl: Duration) {
        if **self.ttl.load() != ttl {
            self.ttl.store(Arc::new(ttl));
            self.entries.store(Arc::new(entries(ttl)));
        }
    }

    pub fn is_sold_out(&self, activity: &Arc<str>, version: u64) -> bool {
        self.entries
            .load()
            .contains_key(&(activity.clone(), version))
    }

    pub fn mark_sold_out(&self, activity: &Arc<str>, version: u64) {
        self.entries.load().insert((activity.clone(), version), ());
    }

    pub fn clear(&self, activity: &Arc<str>, version: u64) {
        self.entries.load().invalidate(&(activity.clone(), version));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_per_version_and_clears() {
        let cache = SoldOutCache::new(Duration::from_secs(60));
        let act: Arc<str> = Arc::from("1001");
        assert!(!cache.is_sold_out(&act, 1));
        cache.mark_sold_out(&act, 1);
        assert!(cache.is_sold_out(&act, 1));
        assert!(!cache.is_sold_out(&act, 2), "a new version is not sold out");
        cache.clear(&act, 1);
        assert!(!cache.is_sold_out(&act, 1));
    }

    #[test]
    fn entries_expire() {
        let cache = SoldOutCache::new(Duration::from_millis(20));
        let act: Arc<str> = Arc::from("1001");
        cache.mark_sold_out(&act, 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while cache.is_sold_out(&act, 1) {
            assert!(std::time::Instant::now() < deadline, "entry never expired");
            std::thread::yield_now();
        }
    }
}
