//! A queue's start as Redis has it, against the configured one: what an SRE who moved a drop is
//! told. A later start (a postponement) is applied by any gateway; an earlier one only by a
//! reload, and only while the queue has not opened (no ticket issued; see `queue_reschedule` in
//! lua/queue_lib.lua). `flashgate check --live`, the reload's answer and its log line, and the
//! start-up log name the start that stays when the configured one is not applied.

use super::store::keys;
use crate::config::Activity;
use crate::stock::{StockStore, StoreError, StoreOp};
use chrono::{DateTime, SecondsFormat, Utc};

/// A queue's start in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedStart {
    /// When the cursor starts (unix ms).
    pub start_ms: i64,
    /// The latest start a reload moved earlier (unix ms; 0: none).
    pub superseded_ms: i64,
    /// The queue opened: a ticket was issued (someone was told a place and a time), or its
    /// pre-queue was drawn at the start.
    pub opened: bool,
}

/// Who is asking: a reload applies an earlier start (before the queue opened), a restart or a
/// check alone does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    Reload,
    Restart,
    Check,
}

/// What an SRE is told about a configured start Redis does not run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartNote {
    /// Moved earlier after the queue opened: its start stays.
    Stays {
        activity: String,
        stays_ms: i64,
        configured_ms: i64,
    },
    /// Moved earlier before the queue opened, by a restart or seen by a check: a reload
    /// applies it, a restart does not.
    ReloadToApply {
        activity: String,
        stays_ms: i64,
        configured_ms: i64,
    },
    /// This file's start is one a reload moved earlier from: an older file.
    Superseded {
        activity: String,
        stays_ms: i64,
        configured_ms: i64,
    },
}

/// Reads `activity`'s queue start from Redis; `None` without a queue or before it was set up.
pub async fn recorded(
    store: &StockStore,
    activity: &Activity,
) -> Result<Option<RecordedStart>, StoreError> {
    if activity.queue.is_none() {
        return Ok(None);
    }
    let (q, _) = keys(store, activity);
    type Fields = (Option<i64>, Option<i64>, Option<String>, Option<u64>);
    let (start, superseded, drawn, seq): Fields = store
        .redis()
        .query(
            StoreOp::Read,
            redis::cmd("HMGET")
                .arg(q)
                .arg("start")
                .arg("superseded")
                .arg("drawn")
                .arg("seq"),
        )
        .await?;
    Ok(start.map(|start_ms| RecordedStart {
        start_ms,
        superseded_ms: superseded.unwrap_or(0),
        opened: drawn.is_some() || seq.unwrap_or(0) > 0,
    }))
}

/// The note for `activity` against its queue's `recorded` start, if any.
pub fn judge(activity: &Activity, recorded: RecordedStart, asker: Asker) -> Option<StartNote> {
    let configured_ms = super::store::start_ms(activity);
    let activity = activity.id.to_string();
    let stays_ms = recorded.start_ms;
    if configured_ms < stays_ms {
        return Some(if recorded.opened {
            StartNote::Stays {
                activity,
                stays_ms,
                configured_ms,
            }
        } else if asker == Asker::Reload {
            return None;
        } else {
            StartNote::ReloadToApply {
                activity,
                stays_ms,
                configured_ms,
            }
        });
    }
    (configured_ms > stays_ms && configured_ms <= recorded.superseded_ms).then_some(
        StartNote::Superseded {
            activity,
            stays_ms,
            configured_ms,
        },
    )
}

/// Both judged: `recorded` read now, for each activity with a queue.
pub async fn notes(
    store: &StockStore,
    activities: impl Iterator<Item = &Activity>,
    asker: Asker,
) -> Result<Vec<StartNote>, StoreError> {
    let mut notes = Vec::new();
    for activity in activities {
        if let Some(recorded) = recorded(store, activity).await? {
            notes.extend(judge(activity, recorded, asker));
        }
    }
    Ok(notes)
}

/// At start-up: each configured queue start Redis does not run on, logged once (a restart
/// does not move a start earlier; the SRE who restarted instead of reloading learns it here).
/// Redis not answering yet: nothing said (`check --live` says it).
pub async fn tell_at_start(store: &StockStore, settings: &crate::config::Settings) {
    match notes(
        store,
        settings.activities.iter().map(|a| &**a),
        Asker::Restart,
    )
    .await
    {
        Ok(notes) => {
            for note in notes {
                tracing::warn!("{note}");
            }
        }
        Err(e) => tracing::debug!(error = %e, "queue starts not read at start-up"),
    }
}

fn at(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_else(|| ms.to_string())
}

impl std::fmt::Display for StartNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartNote::Stays {
                activity,
                stays_ms,
                configured_ms,
            } => write!(
                f,
                "activity {activity}: the waiting room has opened (buyers hold tickets with a \
                 time), so its start stays there, at {}; starts_at {} is not \
                 applied to the queue",
                at(*stays_ms),
                at(*configured_ms),
            ),
            StartNote::ReloadToApply {
                activity,
                stays_ms,
                configured_ms,
            } => write!(
                f,
                "activity {activity}: the waiting room starts at {} in Redis; a reload \
                 (POST /v1/config/reload, or the file watch) moves it to starts_at {} while it \
                 has not opened, a restart does not",
                at(*stays_ms),
                at(*configured_ms)
            ),
            StartNote::Superseded {
                activity,
                stays_ms,
                configured_ms,
            } => write!(
                f,
                "activity {activity}: starts_at {} is a start a reload already moved earlier, \
                 to {} (this file is older than the one applied); the waiting room keeps {}",
                at(*configured_ms),
                at(*stays_ms),
                at(*stays_ms)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity(start_ms: i64) -> Activity {
        let settings = crate::config::testing::settings(
            r#"  - { id: drop, stock: 10, version: 1, per_user_limit: 1, max_per_request: 1, starts_at: "1970-01-01T00:16:40Z", ends_at: "2099-01-01T00:00:00Z", queue: { admit_per_second: 1, opens_at: "1970-01-01T00:00:00Z" } }
"#,
        );
        let mut a = (**settings.activities.get("drop").unwrap()).clone();
        a.starts_at = DateTime::<Utc>::from_timestamp_millis(start_ms).unwrap();
        a
    }

    #[test]
    fn each_note_and_none() {
        let rec = |start_ms, superseded_ms, opened| RecordedStart {
            start_ms,
            superseded_ms,
            opened,
        };
        let a = activity(1_000_000);
        // Agrees, or postponed (any gateway applies a later start).
        assert_eq!(judge(&a, rec(1_000_000, 0, true), Asker::Check), None);
        assert_eq!(judge(&a, rec(900_000, 0, false), Asker::Restart), None);
        // Earlier, opened: stays, whoever asks.
        for asker in [Asker::Reload, Asker::Restart, Asker::Check] {
            let note = judge(&a, rec(1_200_000, 0, true), asker).unwrap();
            assert!(matches!(note, StartNote::Stays { .. }), "{note}");
            assert!(note.to_string().contains("1970-01-01T00:20:00Z"), "{note}");
        }
        // Earlier, not opened: a reload applies it; others are told to reload.
        assert_eq!(judge(&a, rec(1_200_000, 0, false), Asker::Reload), None);
        let note = judge(&a, rec(1_200_000, 0, false), Asker::Restart).unwrap();
        assert!(note.to_string().contains("a restart does not"), "{note}");
        // An older file: its start is one a reload moved away from.
        let note = judge(&a, rec(800_000, 1_000_000, false), Asker::Check).unwrap();
        assert!(matches!(note, StartNote::Superseded { .. }), "{note}");
    }
}
