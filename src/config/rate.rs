//! A token bucket's rate as an SRE writes it: per second, per minute or per hour (exactly one),
//! as nginx's `limit_req` (`r/s`, `r/m`) and envoy's ratelimit (`unit: second | minute | hour`)
//! allow: "one every 10 s" is `per_minute: 6`.

use super::file::BucketSection;
use super::ConfigError;
use governor::Quota;
use std::num::NonZeroU32;
use std::time::Duration;

/// The bucket's quota: one token every (unit / rate), `burst` at most.
///
/// Approximation: the interval between tokens is kept to the nanosecond, so a rate that does not
/// divide its unit (`per_minute: 7`, 8.571428571 s) is slower than written by under a
/// nanosecond per token.
pub fn quota(key: &str, bucket: &BucketSection) -> Result<Quota, ConfigError> {
    let given: Vec<(&str, u32, u64)> = [
        ("per_second", bucket.per_second, 1),
        ("per_minute", bucket.per_minute, 60),
        ("per_hour", bucket.per_hour, 3600),
    ]
    .into_iter()
    .filter_map(|(name, rate, unit_secs)| rate.map(|r| (name, r, unit_secs)))
    .collect();
    let (name, rate, unit_secs) = match given.as_slice() {
        [one] => *one,
        [] => {
            return Err(ConfigError::invalid(
                key,
                "give the rate as one of per_second, per_minute or per_hour",
            ))
        }
        [_, second, ..] => {
            return Err(ConfigError::invalid(
                format!("{key}.{}", second.0),
                "give only one of per_second, per_minute or per_hour",
            ))
        }
    };
    let rate = NonZeroU32::new(rate)
        .ok_or_else(|| ConfigError::invalid(format!("{key}.{name}"), "must be at least 1"))?;
    let burst = NonZeroU32::new(bucket.burst)
        .ok_or_else(|| ConfigError::invalid(format!("{key}.burst"), "must be at least 1"))?;
    let period = Duration::from_secs(unit_secs) / rate.get();
    let quota = Quota::with_period(period)
        .ok_or_else(|| ConfigError::invalid(format!("{key}.{name}"), "is too fast"))?;
    Ok(quota.allow_burst(burst))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(s: Option<u32>, m: Option<u32>, h: Option<u32>) -> BucketSection {
        BucketSection {
            per_second: s,
            per_minute: m,
            per_hour: h,
            burst: 2,
            shadow: false,
            scope: Default::default(),
        }
    }

    #[test]
    fn each_unit_gives_its_interval() {
        let period = |b| quota("k", &b).unwrap().replenish_interval();
        assert_eq!(
            period(bucket(Some(5), None, None)),
            Duration::from_millis(200)
        );
        assert_eq!(period(bucket(None, Some(6), None)), Duration::from_secs(10));
        assert_eq!(
            period(bucket(None, None, Some(2))),
            Duration::from_secs(1800)
        );
        assert_eq!(
            quota("k", &bucket(Some(5), None, None)).unwrap(),
            Quota::per_second(NonZeroU32::new(5).unwrap()).allow_burst(NonZeroU32::new(2).unwrap())
        );
    }

    #[test]
    fn exactly_one_rate() {
        let err = |b| quota("rate_limits.per_user", &b).unwrap_err().to_string();
        assert!(err(bucket(None, None, None)).starts_with("rate_limits.per_user: give the rate"));
        assert!(err(bucket(Some(1), Some(1), None))
            .starts_with("rate_limits.per_user.per_minute: give only one"));
        assert_eq!(
            err(bucket(None, None, Some(0))),
            "rate_limits.per_user.per_hour: must be at least 1"
        );
    }
}
