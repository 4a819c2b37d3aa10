//! Redis's clock as this gateway last read it. Redis's `TIME` is the one clock every gateway
//! shares: the scripts judge holds, deadlines and the sale's hours by it. The gateway's own
//! checks made before any call (is the sale open? is the waiting room open?) use this estimate
//! instead of the local clock, so a gateway whose clock is hours off answers as Redis would.
//!
//! Approximation: the estimate is the local clock plus the offset measured at the last read
//! (every `redis.prewarm_interval_ms`), taken at the midpoint of the `TIME` round trip: off by
//! at most half that round trip plus the drift since. Before any read succeeded (Redis down
//! since start-up) it is the local clock. Nothing depends on it for stock: the scripts check
//! again by Redis's own clock.

use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicI64, Ordering};

/// The offset of Redis's clock from the local one, learned from `TIME`.
#[derive(Debug, Default)]
pub struct RedisClock {
    /// Redis's clock minus the local clock, in ms (0 until the first read).
    offset_ms: AtomicI64,
}

impl RedisClock {
    /// Learns the offset from Redis's time `redis_ms`, read between local times `sent` and
    /// `received`.
    pub fn learn(&self, redis_ms: i64, sent: DateTime<Utc>, received: DateTime<Utc>) {
        let midpoint = sent.timestamp_millis() + (received - sent).num_milliseconds() / 2;
        self.offset_ms.store(redis_ms - midpoint, Ordering::Relaxed);
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
        let sent = DateTime::from_timestamp_millis(1_000_000).unwrap();
        let received = DateTime::from_timestamp_millis(1_000_010).unwrap();
        // Redis two hours ahead, read 5 ms into a 10 ms round trip.
        clock.learn(1_000_005 + 7_200_000, sent, received);
        assert_eq!(clock.offset_ms(), 7_200_000);
        let skew = (clock.now() - Utc::now()).num_milliseconds();
        assert!((7_199_000..=7_200_000).contains(&skew), "{skew}");
        clock.learn(1_000_005 - 3_600_000, sent, received);
        assert_eq!(clock.offset_ms(), -3_600_000);
    }
}
