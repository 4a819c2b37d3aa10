//! `activities[].queue.challenge` and `.draw`: the defence of the drop (proof of work before a
//! ticket, a verifiable draw), read from YAML and validated into runtime settings.

use super::ConfigError;
use schemars::JsonSchema;
use serde::Deserialize;
use std::time::Duration;

/// `activities[].queue.challenge`: a proof of work (the ALTCHA scheme) before a ticket.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChallengeSection {
    /// The largest secret number a challenge hides: a solver tries on average half of it
    /// (SHA-256 each), so 100,000 is about 0.1 to 0.5 s in a browser.
    pub max_number: u64,
    /// Count, don't enforce: a buyer without a valid solution still gets a ticket, counted
    /// (`flashgate_queue_challenges_total{outcome="shadow_passed"}`).
    #[serde(default)]
    pub shadow: bool,
    /// Added to `max_number` per 1,000 tickets waiting (the queue's length as this gateway last
    /// read it), so the work rises with the crowd; capped at 10 times `max_number`. 0: fixed.
    #[serde(default)]
    pub rise_per_1000_waiting: u64,
    /// How long a challenge may be solved and sent back, in seconds.
    #[serde(default = "default_expires_secs")]
    pub expires_secs: u64,
}

fn default_expires_secs() -> u64 {
    300
}

/// Largest `max_number`: past it a browser takes minutes.
pub const MAX_CHALLENGE_NUMBER: u64 = 50_000_000;

/// A validated challenge setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeSettings {
    /// See [`ChallengeSection::max_number`].
    pub max_number: u64,
    /// See [`ChallengeSection::shadow`].
    pub shadow: bool,
    /// See [`ChallengeSection::rise_per_1000_waiting`].
    pub rise_per_1000_waiting: u64,
    /// See [`ChallengeSection::expires_secs`].
    pub expires: Duration,
}

impl ChallengeSettings {
    /// The `max_number` of a challenge issued while `waiting` tickets wait: `max_number` plus
    /// `rise_per_1000_waiting` per full thousand, at most 10 times `max_number`.
    pub fn max_number_for(&self, waiting: u64) -> u64 {
        let rise = self.rise_per_1000_waiting.saturating_mul(waiting / 1000);
        self.max_number
            .saturating_add(rise)
            .min(self.max_number.saturating_mul(10))
    }
}

/// Validates `raw` found at `key` (`activities[i].queue.challenge`).
pub(super) fn challenge(
    key: &str,
    raw: ChallengeSection,
) -> Result<ChallengeSettings, ConfigError> {
    if raw.max_number == 0 || raw.max_number > MAX_CHALLENGE_NUMBER {
        return Err(ConfigError::invalid(
            format!("{key}.max_number"),
            format!("must be 1 to {MAX_CHALLENGE_NUMBER}"),
        ));
    }
    if raw.expires_secs < 10 || raw.expires_secs > 86_400 {
        return Err(ConfigError::invalid(
            format!("{key}.expires_secs"),
            "must be 10 to 86400",
        ));
    }
    Ok(ChallengeSettings {
        max_number: raw.max_number,
        shadow: raw.shadow,
        rise_per_1000_waiting: raw.rise_per_1000_waiting,
        expires: Duration::from_secs(raw.expires_secs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difficulty_rises_with_the_queue_up_to_ten_times() {
        let c = ChallengeSettings {
            max_number: 1000,
            shadow: false,
            rise_per_1000_waiting: 100,
            expires: Duration::from_secs(60),
        };
        assert_eq!(c.max_number_for(0), 1000);
        assert_eq!(c.max_number_for(999), 1000);
        assert_eq!(c.max_number_for(5_500), 1500);
        assert_eq!(c.max_number_for(10_000_000), 10_000);
    }
}
