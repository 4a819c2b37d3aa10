//! Every Prometheus metric flashgate exports, registered in one place.
//!
//! Label values come from enums or from configured activity ids, never from request data, so
//! the number of series is bounded by the configuration (no user ids, no raw paths).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// `activity` label for requests whose activity is not configured (or not known yet).
pub const UNKNOWN_ACTIVITY_LABEL: &str = "_unknown";

/// Lua scripts, as the `script` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptName {
    Reserve,
    Release,
    Confirm,
    Sweep,
    Prewarm,
    Ledger,
    Transfer,
}

impl ScriptName {
    pub const ALL: [ScriptName; 7] = [
        ScriptName::Transfer,
        ScriptName::Reserve,
        ScriptName::Release,
        ScriptName::Confirm,
        ScriptName::Sweep,
        ScriptName::Prewarm,
        ScriptName::Ledger,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ScriptName::Reserve => "reserve",
            ScriptName::Release => "release",
            ScriptName::Confirm => "confirm",
            ScriptName::Sweep => "sweep",
            ScriptName::Prewarm => "prewarm",
            ScriptName::Ledger => "ledger",
            ScriptName::Transfer => "transfer",
        }
    }
}

/// Why a reservation's units were given back, as the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    /// The upstream answered 5xx.
    Upstream5xx,
    /// The upstream could not be reached, timed out, or broke the connection.
    UpstreamError,
    /// The stock store did not answer a reserve in time; the id is released in case it landed.
    StoreTimeout,
    /// The hold deadline passed while the reservation was still pending.
    Expired,
    /// `POST .../release` (an order cancelled, unpaid, or refunded).
    Admin,
    /// The buyer's request turned out malformed after the reserve (a body over the limit).
    BadRequest,
    /// The winner waited longer than `upstream.max_queue_wait_ms` for an upstream slot.
    QueueTimeout,
    /// The backend's order lookup said it holds no such order (`upstream.order_lookup`).
    OrderNotFound,
}

impl ReleaseReason {
    pub const ALL: [ReleaseReason; 8] = [
        ReleaseReason::OrderNotFound,
        ReleaseReason::QueueTimeout,
        ReleaseReason::BadRequest,
        ReleaseReason::Upstream5xx,
        ReleaseReason::UpstreamError,
        ReleaseReason::StoreTimeout,
        ReleaseReason::Expired,
        ReleaseReason::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::Upstream5xx => "upstream_5xx",
            ReleaseReason::UpstreamError => "upstream_error",
            ReleaseReason::StoreTimeout => "store_timeout",
            ReleaseReason::Expired => "expired",
            ReleaseReason::Admin => "admin",
            ReleaseReason::BadRequest => "bad_request",
            ReleaseReason::QueueTimeout => "queue_timeout",
            ReleaseReason::OrderNotFound => "order_not_found",
        }
    }
}

/// Upstream response classes, as the `class` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamClass {
    Success,
    ClientError,
    ServerError,
    Error,
}

impl UpstreamClass {
    pub fn from_status(status: u16) -> Self {
        match status {
            500.. => UpstreamClass::ServerError,
            400..=499 => UpstreamClass::ClientError,
            _ => UpstreamClass::Success,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamClass::Success => "2xx",
            UpstreamClass::ClientError => "4xx",
            UpstreamClass::ServerError => "5xx",
            UpstreamClass::Error => "error",
        }
    }
}

/// What the backend's order lookup answered, as the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    /// 200: it holds the order; the reservation is confirmed.
    Found,
    /// 404: it does not; the reservation is released.
    NotFound,
    /// Anything else, or nothing in time: the reservation stays pending and is asked again.
    Unanswered,
}

impl LookupResult {
    pub const ALL: [LookupResult; 3] = [
        LookupResult::Found,
        LookupResult::NotFound,
        LookupResult::Unanswered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LookupResult::Found => "found",
            LookupResult::NotFound => "not_found",
            LookupResult::Unanswered => "unanswered",
        }
    }
}

/// How a configuration reload ended, as the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    Applied,
    Refused,
}

impl ReloadResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Refused => "refused",
        }
    }
}

/// The stock-store circuit breaker's state, as the `state` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to Redis.
    Closed,
    /// Calls are skipped: the store counts as failed.
    Open,
    /// The open period ended: one probe call goes to Redis.
    HalfOpen,
}

impl BreakerState {
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// The breaker's manual switch (admin API), as the `mode` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerMode {
    /// Opens and closes on the store's answers.
    Auto,
    /// Held open: every sale is handled as if Redis were down.
    ForcedOpen,
    /// Held closed: every sale goes to Redis, whatever it answers.
    ForcedClosed,
}

impl BreakerMode {
    pub const ALL: [BreakerMode; 3] = [
        BreakerMode::Auto,
        BreakerMode::ForcedOpen,
        BreakerMode::ForcedClosed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BreakerMode::Auto => "auto",
            BreakerMode::ForcedOpen => "forced_open",
            BreakerMode::ForcedClosed => "forced_closed",
        }
    }
}

/// What happened to a sale request forwarded without a reservation (`on_store_failure:
/// passthrough`), as the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassthroughOutcome {
    /// Forwarded, marked, for the backend to decide.
    Forwarded,
    /// Over the global passthrough cap: answered `unavailable`.
    Capped,
}

impl PassthroughOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            PassthroughOutcome::Forwarded => "forwarded",
            PassthroughOutcome::Capped => "capped",
        }
    }
}

/// Token buckets, as the `limit` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    PerUser,
    PerIp,
    PerActivity,
    /// The cap on unreserved forwards (its refusals are counted as passthrough `capped`).
    Passthrough,
}

impl LimitKind {
    pub const ALL: [LimitKind; 3] = [LimitKind::PerUser, LimitKind::PerIp, LimitKind::PerActivity];

    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::PerUser => "per_user",
            LimitKind::PerIp => "per_ip",
            LimitKind::PerActivity => "per_activity",
            LimitKind::Passthrough => "passthrough",
        }
    }
}

/// Whether a bucket's refusal was enforced or only counted, as the `mode` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitMode {
    Enforced,
    Shadow,
}

impl LimitMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitMode::Enforced => "enforced",
            LimitMode::Shadow => "shadow",
        }
    }
}

/// Stock-store operations, as the `op` label of `flashgate_redis_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Reserve,
    Release,
    Confirm,
    Sweep,
    Prewarm,
    Read,
    Ready,
    Transfer,
}

impl StoreOp {
    pub const ALL: [StoreOp; 8] = [
        StoreOp::Transfer,
        StoreOp::Reserve,
        StoreOp::Release,
        StoreOp::Confirm,
        StoreOp::Sweep,
        StoreOp::Prewarm,
        StoreOp::Read,
        StoreOp::Ready,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Reserve => "reserve",
            StoreOp::Release => "release",
            StoreOp::Confirm => "confirm",
            StoreOp::Sweep => "sweep",
            StoreOp::Prewarm => "prewarm",
            StoreOp::Read => "read",
            StoreOp::Ready => "ready",
            StoreOp::Transfer => "transfer",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    /// `flashgate_admission_decisions_total{activity, decision}`
    pub decisions: IntCounterVec,
    /// `flashgate_stock_remaining{activity}`: last known remaining units of the current version.
    pub stock_remaining: IntGaugeVec,
    /// `flashgate_redis_script_duration_seconds{script}`
    pub script_duration: HistogramVec,
    /// `flashgate_upstream_responses_total{class}`
    pub upstream_responses: IntCounterVec,
    /// `flashgate_reservations_released_total{activity, reason}`
    pub reservations_released: IntCounterVec,
    /// `flashgate_redis_errors_total{op}`: failed or timed-out stock-store calls.
    pub redis_errors: IntCounterVec,
    /// `flashgate_stock_keys_created_total{activity}`: prewarms that created a stock key.
    pub stock_keys_created: IntCounterVec,
    /// `flashgate_rate_limiter_keys`: token buckets held in memory (all limits).
    pub rate_limiter_keys: IntGauge,
    /// `flashgate_rate_limit_refusals_total{limit, mode}`: refusals by bucket; `shadow` ones
    /// were counted but admitted.
    pub rate_limit_refusals: IntCounterVec,
    /// `flashgate_reservations_confirmed_total{activity, via}`
    pub reservations_confirmed: IntCounterVec,
    /// `flashgate_reservations_retired_total{activity}`: released reservations whose stock
    /// version was gone (their units are counted as retired in the ledger).
    pub reservations_retired: IntCounterVec,
    /// `flashgate_reconcile_drift{activity}`: units not accounted for, summed over versions.
    pub reconcile_drift: IntGaugeVec,
    /// `flashgate_config_reloads_total{result}`
    pub config_reloads: IntCounterVec,
    /// `flashgate_config_generation`: 1 at start, +1 per applied reload.
    pub config_generation: IntGauge,
    /// `flashgate_redis_breaker_state{state}`: 1 for the current state, 0 for the others.
    pub breaker_state: IntGaugeVec,
    /// `flashgate_redis_breaker_mode{mode}`: 1 for the admin switch's position.
    pub breaker_mode: IntGaugeVec,
    /// `flashgate_redis_breaker_opened_total`: times the breaker opened on failures.
    pub breaker_opened: prometheus::IntCounter,
    /// `flashgate_store_failure_passthrough_total{activity, outcome}`
    pub passthrough: IntCounterVec,
    /// `flashgate_upstream_inflight`: forwarded sale requests holding an upstream slot.
    pub upstream_inflight: IntGauge,
    /// `flashgate_upstream_queue_depth`: winners waiting for an upstream slot.
    pub upstream_queue_depth: IntGauge,
    /// `flashgate_upstream_queue_wait_seconds`: time winners waited for a slot (got one or not).
    pub upstream_queue_wait: prometheus::Histogram,
    /// `flashgate_reservations_in_flight`: reservations held by requests not finished yet.
    pub reservations_in_flight: IntGauge,
    /// `flashgate_order_lookups_total{activity, result}`: the backend's answers to order lookups.
    pub order_lookups: IntCounterVec,
    /// `flashgate_activity_refused{activity}`: 1 while Redis's record of the activity refuses its
    /// configuration (segments changed, an older version, an older key layout): not on sale.
    pub activity_refused: IntGaugeVec,
    /// `flashgate_redis_may_evict`: 1 when Redis's maxmemory-policy is not `noeviction` (a key
    /// evicted can sell units twice), 0 when it is, -1 when it cannot be read.
    pub redis_may_evict: IntGauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let decisions = IntCounterVec::new(
            Opts::new(
                "flashgate_admission_decisions_total",
                "Sale requests by activity and decision (contract code, or admitted).",
            ),
            &["activity", "decision"],
        )
        .expect("valid metric");
        let stock_remaining = IntGaugeVec::new(
            Opts::new(
                "flashgate_stock_remaining",
                "Units left in the current stock version, as last seen in Redis.",
            ),
            &["activity"],
        )
        .expect("valid metric");
        let script_duration = HistogramVec::new(
            HistogramOpts::new(
                "flashgate_redis_script_duration_seconds",
                "Round trip of one Lua script call to the stock store.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
            &["script"],
        )
        .expect("valid metric");
        let upstream_responses = IntCounterVec::new(
            Opts::new(
                "flashgate_upstream_responses_total",
                "Upstream answers by class (2xx, 4xx, 5xx, error).",
            ),
            &["class"],
        )
        .expect("valid metric");
        let reservations_released = IntCounterVec::new(
            Opts::new(
                "flashgate_reservations_released_total",
                "Reservations whose units were given back, by reason.",
            ),
            &["activity", "reason"],
        )
        .expect("valid metric");
        let redis_errors = IntCounterVec::new(
            Opts::new(
                "flashgate_redis_errors_total",
                "Stock-store calls that failed or timed out, by operation.",
            ),
            &["op"],
        )
        .expect("valid metric");
        let stock_keys_created = IntCounterVec::new(
            Opts::new(
                "flashgate_stock_keys_created_total",
                "Stock versions created by prewarm (stock key and ledger, created once).",
            ),
            &["activity"],
        )
        .expect("valid metric");
        let rate_limiter_keys = IntGauge::new(
            "flashgate_rate_limiter_keys",
            "Token buckets held in memory (per user, per IP, per activity).",
        )
        .expect("valid metric");
        let rate_limit_refusals = IntCounterVec::new(
            Opts::new(
                "flashgate_rate_limit_refusals_total",
                "Requests a token bucket refused, by bucket; mode=shadow were admitted anyway.",
            ),
            &["limit", "mode"],
        )
        .expect("valid metric");

        let reservations_confirmed = IntCounterVec::new(
            Opts::new(
                "flashgate_reservations_confirmed_total",
                "Reservations confirmed, by who confirmed them (upstream 2xx or admin API).",
            ),
            &["activity", "via"],
        )
        .expect("valid metric");
        let reservations_retired = IntCounterVec::new(
            Opts::new(
                "flashgate_reservations_retired_total",
                "Released reservations whose stock version no longer existed (units retired, not put back on sale).",
            ),
            &["activity"],
        )
        .expect("valid metric");
        let reconcile_drift = IntGaugeVec::new(
            Opts::new(
                "flashgate_reconcile_drift",
                "Units not accounted for: initial - (remaining + pending + confirmed + retired), summed over versions.",
            ),
            &["activity"],
        )
        .expect("valid metric");

        let config_reloads = IntCounterVec::new(
            Opts::new(
                "flashgate_config_reloads_total",
                "Configuration reloads, by result (applied, or refused and the running configuration kept).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let config_generation = IntGauge::new(
            "flashgate_config_generation",
            "The configuration generation running: 1 at start, +1 per applied reload.",
        )
        .expect("valid metric");
        let breaker_state = IntGaugeVec::new(
            Opts::new(
                "flashgate_redis_breaker_state",
                "Stock-store circuit breaker: 1 for its current state (closed, open, half_open).",
            ),
            &["state"],
        )
        .expect("valid metric");
        let breaker_mode = IntGaugeVec::new(
            Opts::new(
                "flashgate_redis_breaker_mode",
                "The breaker's admin switch: 1 for auto, forced_open or forced_closed.",
            ),
            &["mode"],
        )
        .expect("valid metric");
        let breaker_opened = prometheus::IntCounter::new(
            "flashgate_redis_breaker_opened_total",
            "Times the stock-store breaker opened after consecutive failures.",
        )
        .expect("valid metric");
        let passthrough = IntCounterVec::new(
            Opts::new(
                "flashgate_store_failure_passthrough_total",
                "Sale requests met by a failed store on a passthrough activity: forwarded unreserved, or capped.",
            ),
            &["activity", "outcome"],
        )
        .expect("valid metric");
        let upstream_inflight = IntGauge::new(
            "flashgate_upstream_inflight",
            "Forwarded sale requests holding an upstream slot (upstream.max_inflight).",
        )
        .expect("valid metric");
        let upstream_queue_depth = IntGauge::new(
            "flashgate_upstream_queue_depth",
            "Winners waiting in the FIFO for an upstream slot.",
        )
        .expect("valid metric");
        let upstream_queue_wait = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "flashgate_upstream_queue_wait_seconds",
                "Time winners waited for an upstream slot, whether they got one or timed out.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        let reservations_in_flight = IntGauge::new(
            "flashgate_reservations_in_flight",
            "Reservations held by requests still in progress (not yet answered by the upstream or released).",
        )
        .expect("valid metric");

        let order_lookups = IntCounterVec::new(
            Opts::new(
                "flashgate_order_lookups_total",
                "Order lookups before a reservation expires: found (confirmed), not_found (released), unanswered (kept pending, asked again).",
            ),
            &["activity", "result"],
        )
        .expect("valid metric");
        let activity_refused = IntGaugeVec::new(
            Opts::new(
                "flashgate_activity_refused",
                "1 while Redis's record of an activity refuses its configuration (not on sale): segments changed, an older version, an older key layout.",
            ),
            &["activity"],
        )
        .expect("valid metric");
        let redis_may_evict = IntGauge::new(
            "flashgate_redis_may_evict",
            "1 when Redis's maxmemory-policy may evict flashgate's keys (anything but noeviction; a lost key can sell units twice), 0 when noeviction, -1 unknown.",
        )
        .expect("valid metric");
        for collector in [
            Box::new(redis_may_evict.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(order_lookups.clone()),
            Box::new(activity_refused.clone()),
            Box::new(config_reloads.clone()),
            Box::new(config_generation.clone()),
            Box::new(breaker_state.clone()),
            Box::new(breaker_mode.clone()),
            Box::new(breaker_opened.clone()),
            Box::new(passthrough.clone()),
            Box::new(upstream_inflight.clone()),
            Box::new(upstream_queue_depth.clone()),
            Box::new(upstream_queue_wait.clone()),
            Box::new(reservations_in_flight.clone()),
            Box::new(decisions.clone()),
            Box::new(stock_remaining.clone()),
            Box::new(script_duration.clone()),
            Box::new(upstream_responses.clone()),
            Box::new(reservations_released.clone()),
            Box::new(redis_errors.clone()),
            Box::new(stock_keys_created.clone()),
            Box::new(rate_limiter_keys.clone()),
            Box::new(rate_limit_refusals.clone()),
            Box::new(reservations_confirmed.clone()),
            Box::new(reservations_retired.clone()),
            Box::new(reconcile_drift.clone()),
        ] {
            registry
                .register(collector)
                .expect("metric names are unique");
        }
        let metrics = Metrics {
            registry,
            decisions,
            stock_remaining,
            script_duration,
            upstream_responses,
            reservations_released,
            redis_errors,
            stock_keys_created,
            rate_limiter_keys,
            rate_limit_refusals,
            reservations_confirmed,
            reservations_retired,
            reconcile_drift,
            config_reloads,
            config_generation,
            breaker_state,
            breaker_mode,
            breaker_opened,
            passthrough,
            upstream_inflight,
            upstream_queue_depth,
            upstream_queue_wait,
            reservations_in_flight,
            order_lookups,
            activity_refused,
            redis_may_evict,
        };
        metrics.init_static();
        metrics
    }

    /// Creates the series of a configured activity at zero, so dashboards and alerts see them
    /// before the first request.
    pub fn init_activity(&self, activity: &str) {
        for decision in crate::admission::Decision::ALL_CODES {
            self.decisions.with_label_values(&[activity, decision]);
        }
        for reason in ReleaseReason::ALL {
            self.reservations_released
                .with_label_values(&[activity, reason.as_str()]);
        }
        self.stock_remaining.with_label_values(&[activity]);
        self.stock_keys_created.with_label_values(&[activity]);
        for result in LookupResult::ALL {
            self.order_lookups
                .with_label_values(&[activity, result.as_str()]);
        }
        self.activity_refused.with_label_values(&[activity]);
        for via in ["upstream", "admin", "lookup"] {
            self.reservations_confirmed
                .with_label_values(&[activity, via]);
        }
        self.reservations_retired.with_label_values(&[activity]);
        self.reconcile_drift.with_label_values(&[activity]);
        for outcome in [PassthroughOutcome::Forwarded, PassthroughOutcome::Capped] {
            self.passthrough
                .with_label_values(&[activity, outcome.as_str()]);
        }
    }

    /// Creates the label-free series at zero.
    fn init_static(&self) {
        for class in [
            UpstreamClass::Success,
            UpstreamClass::ClientError,
            UpstreamClass::ServerError,
            UpstreamClass::Error,
        ] {
            self.upstream_responses.with_label_values(&[class.as_str()]);
        }
        for limit in LimitKind::ALL {
            for mode in [LimitMode::Enforced, LimitMode::Shadow] {
                self.rate_limit_refusals
                    .with_label_values(&[limit.as_str(), mode.as_str()]);
            }
        }
        for op in StoreOp::ALL {
            self.redis_errors.with_label_values(&[op.as_str()]);
        }
        for script in ScriptName::ALL {
            self.script_duration.with_label_values(&[script.as_str()]);
        }
        for result in [ReloadResult::Applied, ReloadResult::Refused] {
            self.config_reloads.with_label_values(&[result.as_str()]);
        }
        self.config_generation.set(1);
        self.set_breaker(BreakerState::Closed, BreakerMode::Auto);
    }

    /// Shows the breaker's state and switch position (one-hot gauges).
    pub fn set_breaker(&self, state: BreakerState, mode: BreakerMode) {
        for s in BreakerState::ALL {
            self.breaker_state
                .with_label_values(&[s.as_str()])
                .set(i64::from(s == state));
        }
        for m in BreakerMode::ALL {
            self.breaker_mode
                .with_label_values(&[m.as_str()])
                .set(i64::from(m == mode));
        }
    }

    /// Prometheus text exposition of flashgate's metrics and anything registered globally
    /// (Pingora's own, if any).
    pub fn encode(&self) -> Vec<u8> {
        let mut families = self.registry.gather();
        families.extend(prometheus::gather());
        let mut out = Vec::with_capacity(8 * 1024);
        TextEncoder::new()
            .encode(&families, &mut out)
            .expect("text encoding to a Vec cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric the Grafana dashboard queries is one this module exports.
    #[test]
    fn dashboard_queries_only_exported_metrics() {
        let metrics = Metrics::new();
        metrics.init_activity("1001");
        let exported = String::from_utf8(metrics.encode()).unwrap();
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../grafana/flashgate-dashboard.json")).unwrap();
        let mut checked = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                for (i, _) in expr.match_indices("flashgate_") {
                    let name: String = expr[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        exported.contains(&format!("\n{name}{{"))
                            || exported.contains(&format!("\n{name} ")),
                        "panel {:?} queries {name}, which is not exported",
                        panel["title"]
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked >= 10);
    }

    #[test]
    fn series_exist_before_the_first_request() {
        let metrics = Metrics::new();
        metrics.init_activity("1001");
        let text = String::from_utf8(metrics.encode()).unwrap();
        for needle in [
            r#"flashgate_admission_decisions_total{activity="1001",decision="sold_out"} 0"#,
            r#"flashgate_reservations_released_total{activity="1001",reason="upstream_5xx"} 0"#,
            r#"flashgate_upstream_responses_total{class="error"} 0"#,
            r#"flashgate_stock_remaining{activity="1001"} 0"#,
        ] {
            assert!(text.contains(needle), "{needle}");
        }
    }
}
