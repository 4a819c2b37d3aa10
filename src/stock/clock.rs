//! Redis's clock as this gateway last read it. Redis's `TIME` is the one clock every gateway
//! shares: the scripts judge holds, deadlines and the sale's hours by it. The gateway's own
//! checks made before any call (is the sale open? is the waiting room open?) use this estimate
//! instead of the local clock, so a gateway whose clock is hours off answers as Redis would.
//!
//! Approximation: the estimate is the local clock plus the offset measured at the last read
//! (every `redis.prewarm_interval_ms`), taken at the midpoint of the `TIME` round trip: off by
//! at most half that round trip plus the drift since. A read whose round trip took longer than
//! [`MAX_ROUND_TRIP_MS`] is not learned from once one was (a slow Redis would skew the estimate
//! for a whole interval). Before any read succeeded (Redis down since start-up) it is the local
//! clock, and [`RedisClock::known`] says so: the gateway then forwards nothing unreserved
//! (`on_store_failure: passthrough`), whose hours nothing else would judge. Nothing depends on
//! the estimate for stock: the scripts check again by Redis's own clock.

use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// The longest `TIME` round trip learned from, once the offset is known (ms): the estimate is
/// then off by at most half of it.
pub const MAX_ROUND_TRIP_MS: i64 = 100;

/// The offset of Redis's clock from the local one, learned from `TIME`.
#[derive(Debug, Default)]
pub struct RedisClock {
    /// Redis's clock minus the local clock, in ms (0 until the first read).
    offset_ms: AtomicI64,
    /// Whether any read succeeded.
    known: AtomicBool,
}

impl RedisClock {
    /// Learns the offset from Redis's time `redis_ms`, read between local times `sent` and
    /// `received`.
    pub fn learn(&self, redis_ms: i64, sent: DateTime<Utc>, received: DateTime<Utc>) {
        let round_trip = (received - sent).num_milliseconds();
        if round_trip > MAX_ROUND_TRIP_MS && self.known() {
            return;
        }
        let midpoint = sent.timestamp_millis() + round_trip / 2;
        self.offset_ms.store(redis_ms - midpoint, Ordering::Relaxed);
        self.known.store(true, Ordering::Release);
    }

    /// Whether Redis's clock was read at least once.
    pub fn known(&self) -> bool {
        self.known.load(Ordering::Acquire)
    }

    /// Redis's clock now, as estimated.
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.offset_ms.load(Ordering::Relaxed))
    }

    /// The offset last learned (ms): for the log and the tests.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_at_the_midpoint_of_the_round_trip() {
        let clock = RedisClock::default();
        assert_eq!(clock.offset_ms(), 0);
        assert!(!clock.known());
        let sent = DateTime::from_timestamp_millis(1_000_000).unwrap();
        let received = DateTime::from_timestamp_millis(1_000_010).unwrap();
        // Redis two hours ahead, read 5 ms into a 10 ms round trip.
        clock.learn(1_000_005 + 7_200_000, sent, received);
        assert_eq!(clock.offset_ms(), 7_200_000);
        let skew = (clock.now() - Utc::now()).num_milliseconds();
        assert!((7_199_000..=7_200_000).contains(&skew), "{skew}");
        assert!(clock.known());
        clock.learn(1_000_005 - 3_600_000, sent, received);
        assert_eq!(clock.offset_ms(), -3_600_000);
    }

    #[test]
    fn a_slow_read_is_learned_from_only_while_nothing_better_is_known() {
        let clock = RedisClock::default();
        let sent = DateTime::from_timestamp_millis(1_000_000).unwrap();
        let slow = DateTime::from_timestamp_millis(1_000_000 + 2 * MAX_ROUND_TRIP_MS).unwrap();
        clock.learn(1_000_000 + MAX_ROUND_TRIP_MS + 500, sent, slow);
        assert_eq!(clock.offset_ms(), 500, "the first read, however slow");
        clock.learn(1_000_000 + MAX_ROUND_TRIP_MS + 9_000, sent, slow);
        assert_eq!(
            clock.offset_ms(),
            500,
            "a slow read once one is known: not learned"
        );
        let quick = DateTime::from_timestamp_millis(1_000_010).unwrap();
        clock.learn(1_000_005 + 9_000, sent, quick);
        assert_eq!(clock.offset_ms(), 9_000);
    }
}
