//! The YAML's activities, as written (see the parent module): each sale, its waiting room,
//! and the policies it names.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivitySection {
    /// Activity id as it appears in the sale route path (letters, digits, `-`, `_`).
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub id: String,
    /// Units on sale in this version (or `variants`, one stock each: exactly one of the two).
    #[serde(default)]
    #[schemars(range(max = 9_007_199_254_740_991u64))]
    pub stock: Option<u64>,
    /// The sale's variants (sizes, colours), each with its own stock, instead of `stock`: one
    /// queue and one `per_user_limit` across them all. Adding or removing a variant, or changing
    /// its stock, is a stock change: it needs a new `version`.
    #[serde(default)]
    pub variants: Option<Vec<VariantSection>>,
    /// Stock version: a new number starts a new stock key from `stock` (restock or correction).
    pub version: u64,
    /// Units one user may hold in this activity.
    #[schemars(range(min = 1))]
    pub per_user_limit: u32,
    /// Most units one request may ask for.
    #[schemars(range(min = 1))]
    pub max_per_request: u32,
    /// Sale opens (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub starts_at: String,
    /// Sale closes (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub ends_at: String,
    /// What confirms a reservation: `upstream` (a 2xx answer) or `explicit` (the admin API).
    #[serde(default)]
    pub confirm: ConfirmMode,
    /// Seconds a pending reservation is held before it expires and its units return;
    /// default `signing.ttl_secs`.
    #[serde(default)]
    pub hold_secs: Option<u64>,
    /// Stock split across this many segments, each with its own hash tag (Redis Cluster spreads
    /// them over masters); every buyer has a home segment holding their units.
    #[serde(default = "default_segments")]
    #[schemars(range(min = 1, max = 64))]
    pub segments: u32,
    /// When the stock store is down (or the breaker open): `reject` answers `unavailable`;
    /// `passthrough` forwards the request without a reservation, marked for the backend, at
    /// the `rate_limits.passthrough` cap, for the backend's own stock check to decide.
    #[serde(default)]
    pub on_store_failure: StoreFailurePolicy,
    /// A waiting room in front of the purchase: buyers take a numbered ticket and buy in turn,
    /// at one admission rate for the whole fleet.
    #[serde(default)]
    pub queue: Option<QueueSection>,
    /// Shown on the waiting and refusal pages.
    #[serde(default)]
    pub title: Option<String>,
    /// Where a browser buyer whose purchase from the waiting page won is sent (303), `{jti}`
    /// filled in; without it, a page says what they won.
    #[serde(default)]
    pub success_url: Option<String>,
    /// Phases before the public sale (`starts_at`), in order: in each, the buyers it names may
    /// buy already. One stock and one `per_user_limit` across every phase and the public sale.
    #[serde(default)]
    pub phases: Vec<PhaseSection>,
    /// After a sell-out, buyers told `sold_out` may join a line: each unit that comes back is
    /// held for the next buyer in it, then passes on.
    #[serde(default)]
    pub second_chance: Option<SecondChanceSection>,
}

/// `activities[].second_chance`: the line for units that come back after a sell-out.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecondChanceSection {
    /// Seconds a returned unit is held for the buyer at the head of the line before it passes
    /// to the next (1 to 3600).
    #[schemars(range(min = 1, max = 3600))]
    pub window_secs: u64,
}

/// `activities[].phases[]`: a time before the public start when some buyers may buy.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PhaseSection {
    /// The phase's id, named in the reservation's `phase` claim, the admin view and the report
    /// (letters, digits, `-`, `_`; not `public`, the name of the sale after the phases).
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub id: String,
    /// When the phase's buyers may start buying (RFC 3339): after the phase before it, before
    /// the activity's `starts_at`. They may go on buying until the sale ends.
    #[schemars(extend("format" = "date-time"))]
    pub starts_at: String,
    /// Who may buy in this phase.
    pub who: WhoSection,
    /// Units one buyer may hold while this phase is the latest one open to them; the
    /// activity's `per_user_limit` otherwise (never more than it).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub per_user_limit: Option<u32>,
}

/// `activities[].phases[].who`: exactly one of `claim`, `header` or `list`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhoSection {
    /// A claim of the buyer's verified identity token (`identity.jwt`): a string, or an array
    /// of strings, one of which must be in `any_of`.
    #[serde(default)]
    pub claim: Option<String>,
    /// A header set by the trusted auth layer in front (`identity.trusted_proxies`): its value
    /// must be in `any_of`. The header is stripped from every other peer.
    #[serde(default)]
    pub header: Option<String>,
    /// The values that qualify, for `claim` or `header`.
    #[serde(default)]
    pub any_of: Option<Vec<String>>,
    /// A named list of user ids, loaded into Redis with `flashgate access load`.
    #[serde(default)]
    pub list: Option<String>,
}

/// `activities[].variants[]`: one variant of a drop.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VariantSection {
    /// The variant's id, as a buyer names it (`?variant=42`, or `{variant}` in the path):
    /// letters, digits, `-`, `_`; unique within the activity.
    pub id: String,
    /// Units of this variant on sale in the activity's version.
    #[schemars(range(max = 9_007_199_254_740_991u64))]
    pub stock: u64,
    /// Shown on the waiting page ("EU 42"); the id when absent.
    #[serde(default)]
    pub title: Option<String>,
}

/// `activities[].queue`: the waiting room.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    /// Tickets admitted to the purchase per second, for all gateways together.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub admit_per_second: u32,
    /// Arrivals from here until `starts_at` are put in a random order at `starts_at` (RFC
    /// 3339); without it the queue opens at `starts_at`, first come, first served.
    #[serde(default)]
    pub opens_at: Option<String>,
    /// How long an admitted ticket may buy, in seconds of the queue's progress at
    /// `admit_per_second`, before it lapses.
    #[serde(default = "default_admission_window_secs")]
    pub admission_window_secs: u64,
    /// A new arrival is told it is very likely too late when the places ahead of it exceed the
    /// units left times this (room for buyers ahead who do not buy).
    #[serde(default = "default_too_late_factor")]
    #[schemars(range(min = 1.0))]
    pub too_late_factor: f64,
    /// Where the waiting page sends a browser whose turn came (the shop's checkout page); by
    /// default the page submits the purchase itself.
    #[serde(default)]
    pub landing_url: Option<String>,
    /// A proof of work before a ticket: a bot pays for each place it takes.
    #[serde(default)]
    pub challenge: Option<crate::config::defence::ChallengeSection>,
    /// Publish a commitment to the pre-queue draw's seed from `opens_at` and the seed from
    /// `starts_at`, so anyone can check the draw.
    #[serde(default)]
    pub draw: bool,
    /// Seconds without a poll after which a ticket gives its turn away.
    pub skip_absent_after_secs: Option<u64>,
    /// Most admitted buyers who have not bought yet, fleet-wide.
    pub max_active: Option<u32>,
}

/// What a sale request gets while the stock store cannot be asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreFailurePolicy {
    /// Answer `unavailable` (503): nothing is sold without Redis.
    #[default]
    Reject,
    /// Forward unreserved, marked with `X-Flashgate-Passthrough`, at a global cap.
    Passthrough,
}

/// What moves a reservation from pending to confirmed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConfirmMode {
    /// A 2xx answer from the upstream confirms.
    #[default]
    Upstream,
    /// The backend confirms through `POST /v1/activities/{act}/reservations/{jti}/confirm`.
    Explicit,
}

fn default_admission_window_secs() -> u64 {
    60
}
fn default_too_late_factor() -> f64 {
    1.5
}
fn default_segments() -> u32 {
    1
}
