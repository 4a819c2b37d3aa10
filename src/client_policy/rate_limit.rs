//! Keyed token buckets (governor): per user, per client IP, per activity. Checked before
//! anything that costs a Redis call.
//!
//! Approximations, on purpose:
//! - Buckets are keyed by a 64-bit keyed hash of the key (user id, IP), not the key itself, so a
//!   million buyers cost a million small fixed-size entries. Two users would share a bucket only on a
//!   64-bit collision under a per-process random key (not something a buyer can aim for).
//! - Idle buckets are dropped by [`KeyedRateLimiter::evict_idle`], run every
//!   `rate_limits.evict_interval_ms`. Only buckets that have refilled completely are dropped, and
//!   a full bucket behaves exactly like a new one, so eviction never lets anyone through earlier.
//!   Between sweeps memory grows with the number of distinct users seen in that interval.
//! - Limits are per gateway instance: N instances behind a balancer allow up to N times the rate.

use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

type KeyedLimiter<C> = RateLimiter<
    u64,
    DashMapStateStore<u64>,
    C,
    governor::middleware::NoOpMiddleware<<C as Clock>::Instant>,
>;

/// Token bucket per key. With no quota configured every check passes.
pub struct KeyedRateLimiter<C: Clock = DefaultClock> {
    limiter: Option<KeyedLimiter<C>>,
    hasher: RandomState,
}

impl KeyedRateLimiter<DefaultClock> {
    pub fn new(quota: Option<Quota>) -> Self {
        Self::with_clock(quota, DefaultClock::default())
    }
}

impl<C: Clock> KeyedRateLimiter<C> {
    /// A limiter on the given clock (tests use governor's `FakeRelativeClock`).
    pub fn with_clock(quota: Option<Quota>, clock: C) -> Self {
        KeyedRateLimiter {
            limiter: quota.map(|q| RateLimiter::dashmap_with_clock(q, clock)),
            hasher: RandomState::new(),
        }
    }

    /// Takes one token from the key's bucket, or says how long until one is available.
    pub fn check<K: std::hash::Hash + ?Sized>(&self, key: &K) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter
            .check_key(&self.hasher.hash_one(key))
            .map_err(|not_until| not_until.wait_time_from(limiter.clock().now()))
    }

    /// Drops buckets that have refilled completely; returns how many buckets remain.
    pub fn evict_idle(&self) -> usize {
        let Some(limiter) = &self.limiter else {
            return 0;
        };
        limiter.retain_recent();
        limiter.shrink_to_fit();
        limiter.len()
    }

    /// Buckets currently held.
    pub fn len(&self) -> usize {
        self.limiter.as_ref().map_or(0, |l| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;
    use std::num::NonZeroU32;

    fn quota(per_second: u32, burst: u32) -> Quota {
        Quota::per_second(NonZeroU32::new(per_second).unwrap())
            .allow_burst(NonZeroU32::new(burst).unwrap())
    }

    #[test]
    fn burst_then_refill_per_user() {
        let clock = FakeRelativeClock::default();
        let limiter = KeyedRateLimiter::with_clock(Some(quota(5, 5)), clock.clone());
        for _ in 0..5 {
            assert!(limiter.check("alice").is_ok());
        }
        let wait = limiter.check("alice").unwrap_err();
        assert_eq!(wait, Duration::from_millis(200));
        // Another user has their own bucket.
        assert!(limiter.check("bob").is_ok());
        clock.advance(Duration::from_millis(200));
        assert!(limiter.check("alice").is_ok());
        assert!(limiter.check("alice").is_err());
    }

    #[test]
    fn eviction_drops_only_refilled_buckets() {
        let clock = FakeRelativeClock::default();
        let limiter = KeyedRateLimiter::with_clock(Some(quota(1, 2)), clock.clone());
        for i in 0..1000 {
            limiter.check(&format!("user-{i}")).unwrap();
        }
        assert_eq!(limiter.len(), 1000);
        clock.advance(Duration::from_millis(2500));
        // "busy" empties its bucket now; everyone else refilled long ago.
        limiter.check("busy").unwrap();
        limiter.check("busy").unwrap();
        assert_eq!(limiter.evict_idle(), 1);
        // Eviction kept busy's state: still empty, not a fresh bucket.
        assert!(limiter.check("busy").is_err());
        clock.advance(Duration::from_secs(10));
        assert_eq!(limiter.evict_idle(), 0);
    }

    #[test]
    fn no_quota_means_no_limit() {
        let limiter = KeyedRateLimiter::new(None);
        for _ in 0..100 {
            assert!(limiter.check("alice").is_ok());
        }
        assert_eq!(limiter.evict_idle(), 0);
    }
}
