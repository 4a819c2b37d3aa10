//! The waiting room's admission that follows live buyers (`activities[].queue.skip_absent_after_secs`,
//! `queue.max_active`): validated into [`Stepped`]. With neither key the queue keeps its
//! time-function cursor.

use super::file::QueueSection;
use super::ConfigError;
use std::time::Duration;

/// The stepped admission (see `lua/queue_lib.lua`, `queue_step`): set when either key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stepped {
    /// A ticket not polled for this long gives its turn away when the cursor reaches it.
    pub skip_absent_after: Option<Duration>,
    /// At most this many admitted buyers who have not yet bought nor lapsed, fleet-wide.
    pub max_active: Option<u32>,
}

/// Longest `skip_absent_after_secs`: an hour (a buyer away longer has left).
pub const MAX_SKIP_ABSENT_AFTER_SECS: u64 = 3_600;
/// Shortest `skip_absent_after_secs`: a waiting client is asked back at least every
/// `skip / 3` (see `waiting::view`), and a client's refresh is never asked below a second.
pub const MIN_SKIP_ABSENT_AFTER_SECS: u64 = 5;
/// Highest `admit_per_second` of a stepped queue: each gateway's read walks at most 512 places
/// four times a second (`STEP_MAX` in `lua/queue_lib.lua`), skipped ones included.
pub const MAX_STEPPED_ADMIT_PER_SECOND: u32 = 1_000;

/// Validates the two keys of a queue section (`field` names a key under it).
pub fn stepped(
    field: impl Fn(&str) -> String,
    raw: &QueueSection,
) -> Result<Option<Stepped>, ConfigError> {
    let (skip_absent_after_secs, max_active) = (raw.skip_absent_after_secs, raw.max_active);
    if let Some(secs) = skip_absent_after_secs {
        if !(MIN_SKIP_ABSENT_AFTER_SECS..=MAX_SKIP_ABSENT_AFTER_SECS).contains(&secs) {
            return Err(ConfigError::invalid(
                field("skip_absent_after_secs"),
                format!(
                    "must be {MIN_SKIP_ABSENT_AFTER_SECS} to {MAX_SKIP_ABSENT_AFTER_SECS} seconds"
                ),
            ));
        }
    }
    if max_active == Some(0) {
        return Err(ConfigError::invalid(
            field("max_active"),
            "must be at least 1",
        ));
    }
    if skip_absent_after_secs.is_none() && max_active.is_none() {
        return Ok(None);
    }
    if raw.admit_per_second > MAX_STEPPED_ADMIT_PER_SECOND {
        return Err(ConfigError::invalid(
            field("admit_per_second"),
            format!(
                "must be at most {MAX_STEPPED_ADMIT_PER_SECOND} with skip_absent_after_secs or max_active"
            ),
        ));
    }
    Ok(Some(Stepped {
        skip_absent_after: skip_absent_after_secs.map(Duration::from_secs),
        max_active,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(skip: Option<u64>, max_active: Option<u32>, rate: u32) -> QueueSection {
        serde_json::from_value(serde_json::json!({
            "admit_per_second": rate,
            "skip_absent_after_secs": skip,
            "max_active": max_active,
        }))
        .unwrap()
    }

    fn field(f: &str) -> String {
        format!("q.{f}")
    }

    #[test]
    fn either_key_makes_the_queue_stepped_neither_keeps_the_time_cursor() {
        assert_eq!(stepped(field, &section(None, None, 5_000)).unwrap(), None);
        assert_eq!(
            stepped(field, &section(Some(30), None, 100)).unwrap(),
            Some(Stepped {
                skip_absent_after: Some(Duration::from_secs(30)),
                max_active: None
            })
        );
        assert_eq!(
            stepped(field, &section(None, Some(500), 1_000)).unwrap(),
            Some(Stepped {
                skip_absent_after: None,
                max_active: Some(500)
            })
        );
        let refused = |s| stepped(field, &s).unwrap_err().to_string();
        assert!(refused(section(Some(4), None, 10)).contains("q.skip_absent_after_secs"));
        assert!(refused(section(None, Some(0), 10)).contains("q.max_active"));
        assert!(refused(section(None, Some(9), 1_001)).contains("q.admit_per_second"));
    }
}
