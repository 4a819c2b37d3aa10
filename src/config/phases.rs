//! `activities[].phases` as the gateway runs them (validated in `phase_checks`): who may buy before the public start, from when, and how
//! many units each may hold meanwhile. The stock and the per-buyer units are the activity's,
//! shared by every phase; the reserve script judges the buyer's phase by Redis's clock.

use chrono::{DateTime, Utc};
use http::HeaderName;
use std::num::NonZeroU32;
use std::sync::Arc;

/// Most phases one activity may have (each is a few numbers a reserve carries).
pub const MAX_PHASES: usize = 8;
/// Most values one `who.any_of` may list.
pub const MAX_ANY_OF: usize = 64;
/// The phase a reservation made after every phase (at or after `starts_at`) names.
pub const PUBLIC: &str = "public";

/// One phase before the public sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    pub id: Arc<str>,
    pub starts_at: DateTime<Utc>,
    pub who: Who,
    /// The most units a buyer may hold while this is the latest phase open to them (`None`:
    /// the activity's).
    pub per_user_limit: Option<NonZeroU32>,
}

/// Who may buy in a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// A claim of the verified identity token, one of whose values is in `any_of`.
    Claim { claim: String, any_of: Vec<String> },
    /// A header from a trusted proxy, whose value is in `any_of`.
    Header {
        name: HeaderName,
        any_of: Vec<String>,
    },
    /// A named list of user ids in Redis (`flashgate access load`).
    List(Arc<str>),
}

impl Who {
    /// Whether `value` is one of the values that qualify (claims and headers).
    pub fn admits(any_of: &[String], value: &str) -> bool {
        any_of.iter().any(|v| v == value)
    }
}
