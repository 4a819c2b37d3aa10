//! Local "sold out" pre-check (moka): once this instance learns that an activity's current stock
//! version is at zero, it answers `sold_out` without calling Redis until the entry expires.
//!
//! The TTL is the reader's: each check passes its configuration generation's
//! `sold_out_cache.ttl_ms`, so a reload shortening it applies to the next request; a mark is
//! kept (in memory) for the TTL of the generation that made it.
//!
//! Approximation: the entry lives for `sold_out_cache.ttl_ms`. If units come back meanwhile (a
//! release on another instance, a restock by version bump is a different key and not affected),
//! this instance keeps answering `sold_out` for at most that long. Releases made by this
//! instance clear the entry at once.

use moka::sync::Cache;
use moka::Expiry;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bound on entries: activities × versions in flight; far above any real config.
const MAX_ENTRIES: u64 = 10_000;

/// A mark: when it was made, and for how long the generation that made it keeps it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    ttl: Duration,
}

/// Each mark expires after its own TTL.
struct MarkExpiry;

impl Expiry<(Arc<str>, u64), Mark> for MarkExpiry {
    fn expire_after_create(
        &self,
        _: &(Arc<str>, u64),
        mark: &Mark,
        _: Instant,
    ) -> Option<Duration> {
        Some(mark.ttl)
    }
}

pub struct SoldOutCache {
    entries: Cache<(Arc<str>, u64), Mark>,
}

impl Default for SoldOutCache {
    fn default() -> Self {
        Self::new()
    }
}

impl SoldOutCache {
    pub fn new() -> Self {
        SoldOutCache {
            entries: Cache::builder()
                .max_capacity(MAX_ENTRIES)
                .expire_after(MarkExpiry)
                .build(),
        }
    }

    /// Whether `activity`'s `version` was marked sold out less than `ttl` ago.
    pub fn is_sold_out(&self, activity: &Arc<str>, version: u64, ttl: Duration) -> bool {
        self.entries
            .get(&(activity.clone(), version))
            .is_some_and(|mark| mark.at.elapsed() < ttl)
    }

    /// Marks `version` sold out, kept for `ttl` (the marking generation's).
    pub fn mark_sold_out(&self, activity: &Arc<str>, version: u64, ttl: Duration) {
        self.entries.insert(
            (activity.clone(), version),
            Mark {
                at: Instant::now(),
                ttl,
            },
        );
    }

    pub fn clear(&self, activity: &Arc<str>, version: u64) {
        self.entries.invalidate(&(activity.clone(), version));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn marks_per_version_and_clears() {
        let cache = SoldOutCache::new();
        let act: Arc<str> = Arc::from("1001");
        assert!(!cache.is_sold_out(&act, 1, MINUTE));
        cache.mark_sold_out(&act, 1, MINUTE);
        assert!(cache.is_sold_out(&act, 1, MINUTE));
        assert!(
            !cache.is_sold_out(&act, 2, MINUTE),
            "a new version is not sold out"
        );
        cache.clear(&act, 1);
        assert!(!cache.is_sold_out(&act, 1, MINUTE));
    }

    #[test]
    fn entries_expire() {
        let cache = SoldOutCache::new();
        let act: Arc<str> = Arc::from("1001");
        let ttl = Duration::from_millis(20);
        cache.mark_sold_out(&act, 1, ttl);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while cache.is_sold_out(&act, 1, ttl) {
            assert!(std::time::Instant::now() < deadline, "entry never expired");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_shorter_ttl_applies_to_marks_made_before_it() {
        let cache = SoldOutCache::new();
        let act: Arc<str> = Arc::from("1001");
        cache.mark_sold_out(&act, 1, MINUTE);
        assert!(cache.is_sold_out(&act, 1, MINUTE));
        assert!(
            !cache.is_sold_out(&act, 1, Duration::ZERO),
            "a reader with a shorter TTL does not trust an older mark"
        );
    }
}
