//! Bounds one setting puts on another: how long a sale trip can take once admitted, and how
//! long an activity's keys must outlive its close for its lifecycle to finish.

use super::settings::{Activities, RedisSettings, UpstreamSettings};
use super::ConfigError;
use std::time::Duration;

/// The keys of an activity expire `redis.key_ttl_after_end_secs` after its `ends_at`: by then
/// every reservation made before the close must have settled, or its record, its user's units
/// and its ledger would vanish while it is still pending (and a late confirm or release would
/// find nothing). The last one made at the close may be replayed just before its hold deadline
/// (its trip then runs past it), is swept once due (the order lookup, when configured, asks
/// until its give-up time, then once more a retry interval later), within a sweep.
/// Approximation: with an order lookup and no `give_up_after_secs`, a reservation whose backend
/// never answers stays pending for ever: its keys still expire at the retention's end.
pub(super) fn retention_covers_the_lifecycle(
    redis: &RedisSettings,
    upstream: &UpstreamSettings,
    activities: &Activities,
    longest_trip: Duration,
) -> Result<(), ConfigError> {
    let longest_hold = activities.iter().map(|a| a.hold).max().unwrap_or_default();
    let lookup = upstream.order_lookup.as_ref().map_or(Duration::ZERO, |l| {
        l.give_up_after.unwrap_or_default() + l.retry_interval + l.timeout
    });
    let needed = longest_hold + longest_trip + lookup + redis.sweep_interval;
    if redis.key_ttl_after_end < needed {
        let secs = |d: Duration| d.as_secs_f64().ceil() as u64;
        return Err(ConfigError::invalid(
            "redis.key_ttl_after_end_secs",
            format!(
                "is {} s, but a reservation made at the close can settle up to {} s later (the \
                 longest hold_secs, {} s, plus a sale trip, {} s, plus the order lookup's give-up \
                 time, retry interval and timeout, {} s, plus a sweep): set it to at least {}",
                redis.key_ttl_after_end.as_secs(),
                secs(needed),
                secs(longest_hold),
                secs(longest_trip),
                secs(lookup),
                secs(needed)
            ),
        ));
    }
    Ok(())
}

/// The longest a sale request can take once admitted: the stock call, the wait for a slot at
/// the backend, a connect to each address in turn (one try per address), and the backend's
/// answer (its release on failure is bounded by the same store timeout, inside the read
/// timeout's slack only approximately). A reservation is never due for the sweep sooner than
/// this after it was made, whatever its hold.
pub(super) fn longest_sale_trip(redis: &RedisSettings, upstream: &UpstreamSettings) -> Duration {
    let connects = upstream.addresses.len().max(1) as u32;
    redis.timeout
        + upstream.max_queue_wait
        + upstream.connect_timeout * connects
        + upstream.read_timeout
}

/// `server.grace_period_secs` when unset: the longest trip rounded up to whole seconds, plus one
/// in which requests read just before the listeners closed still take reservations (see
/// `Drain::takes_new_reservations`): that window is over 1 s and at most 2 s.
pub(super) fn default_grace_period(longest_trip: Duration) -> Duration {
    let whole = longest_trip.as_secs() + u64::from(longest_trip.subsec_nanos() > 0);
    Duration::from_secs(whole + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grace_is_the_trip_rounded_up_plus_a_second() {
        let ms = Duration::from_millis;
        // gateway.yaml's trip: 50 ms store + 2 s queue wait + 1 s connect + 5 s read.
        assert_eq!(default_grace_period(ms(8050)), ms(10_000));
        assert_eq!(default_grace_period(ms(8001)), ms(10_000));
        assert_eq!(default_grace_period(ms(8000)), ms(9_000));
        assert_eq!(default_grace_period(ms(0)), ms(1_000));
    }
}
