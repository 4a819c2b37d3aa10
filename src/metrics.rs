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
}

impl ReleaseReason {
    pub const ALL: [ReleaseReason; 6] = [
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

/// Token buckets, as the `limit` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    PerUser,
    PerIp,
    PerActivity,
}

impl LimitKind {
    pub const ALL: [LimitKind; 3] = [LimitKind::PerUser, LimitKind::PerIp, LimitKind::PerActivity];

    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::PerUser => "per_user",
            LimitKind::PerIp => "per_ip",
            LimitKind::PerActivity => "per_activity",
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

        for collector in [
            Box::new(decisions.clone()) as Box<dyn prometheus::core::Collector>,
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
        for via in ["upstream", "admin"] {
            self.reservations_confirmed
                .with_label_values(&[activity, via]);
        }
        self.reservations_retired.with_label_values(&[activity]);
        self.reconcile_drift.with_label_values(&[activity]);
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
