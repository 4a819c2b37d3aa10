//! Every Prometheus metric flashgate exports, registered in one place, each written once (the
//! [`metrics!`] table below: name, help, labels).
//!
//! Label values come from the enums of the domain each metric counts ([`label_enum!`] gives
//! them `as_str` and `ALL`), or from configured activity ids; never from request data, so the
//! number of series is bounded by the configuration (no user ids, no raw paths). The series of
//! a configured activity are created at zero by the gateway (see `gateway::preset_series`).

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Where the per-variant stock gauge is registered; [`Metrics::encode`] exports its series
/// under `flashgate_stock_remaining`, beside the activities without variants (one family whose
/// series carry `variant` only where the activity has variants).
const VARIANT_STOCK_FAMILY: &str = "flashgate_stock_remaining_by_variant";

/// Moves the per-variant stock series into `flashgate_stock_remaining` (made if no activity
/// without variants is configured).
fn merge_variant_stock(families: &mut Vec<prometheus::proto::MetricFamily>) {
    let Some(at) = families
        .iter()
        .position(|f| f.name() == VARIANT_STOCK_FAMILY)
    else {
        return;
    };
    let mut by_variant = families.remove(at);
    if by_variant.get_metric().is_empty() {
        return;
    }
    match families
        .iter_mut()
        .find(|f| f.name() == "flashgate_stock_remaining")
    {
        Some(plain) => {
            let metrics = by_variant.take_metric();
            plain.mut_metric().extend(metrics);
        }
        None => {
            by_variant.set_name("flashgate_stock_remaining".to_owned());
            families.push(by_variant);
        }
    }
}

/// `activity` label for requests whose activity is not configured (or not known yet).
pub const UNKNOWN_ACTIVITY_LABEL: &str = "_unknown";

/// An enum whose variants are label values: `as_str` and the list of them all (`ALL`, for
/// creating every series up front).
#[macro_export]
macro_rules! label_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $label,)+ }
            }
        }
    };
}

/// How each kind of metric is made from its table row.
trait Family: Clone + Collector + 'static {
    fn make(name: &str, help: &str, labels: &[&str], buckets: Option<Vec<f64>>) -> Self;
}

impl Family for IntCounterVec {
    fn make(name: &str, help: &str, labels: &[&str], _: Option<Vec<f64>>) -> Self {
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
    }
}

impl Family for IntGaugeVec {
    fn make(name: &str, help: &str, labels: &[&str], _: Option<Vec<f64>>) -> Self {
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
    }
}

impl Family for HistogramVec {
    fn make(name: &str, help: &str, labels: &[&str], buckets: Option<Vec<f64>>) -> Self {
        let opts = HistogramOpts::new(name, help).buckets(buckets.expect("buckets"));
        HistogramVec::new(opts, labels).expect("valid metric")
    }
}

impl Family for IntGauge {
    fn make(name: &str, help: &str, _: &[&str], _: Option<Vec<f64>>) -> Self {
        IntGauge::new(name, help).expect("valid metric")
    }
}

impl Family for IntCounter {
    fn make(name: &str, help: &str, _: &[&str], _: Option<Vec<f64>>) -> Self {
        IntCounter::new(name, help).expect("valid metric")
    }
}

impl Family for Histogram {
    fn make(name: &str, help: &str, _: &[&str], buckets: Option<Vec<f64>>) -> Self {
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.expect("buckets")))
            .expect("valid metric")
    }
}

macro_rules! metrics {
    ($($(#[$doc:meta])* $field:ident: $kind:ty = $name:literal [$($label:literal),*] $(buckets $buckets:expr)?, $help:literal;)*) => {
        pub struct Metrics {
            registry: Registry,
            $($(#[$doc])* pub $field: $kind,)*
        }

        impl Metrics {
            pub fn new() -> Metrics {
                let registry = Registry::new();
                $(
                    let $field = <$kind as Family>::make(
                        $name,
                        $help,
                        &[$($label),*],
                        None$(.or(Some($buckets.to_vec())))?,
                    );
                    registry
                        .register(Box::new($field.clone()))
                        .expect("metric names are unique");
                )*
                Metrics { registry, $($field,)* }
            }
        }
    };
}

const SCRIPT_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Waiting-room waits: from a second to an hour.
const WAIT_BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 2700.0, 3600.0,
];
/// Items per batched script call: 1 (alone) to 32 (the bound).
const BATCH_BUCKETS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0];
const QUEUE_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

metrics! {
    /// Sale requests by decision (a contract code, `admitted` or `passthrough`).
    decisions: IntCounterVec = "flashgate_admission_decisions_total" ["activity", "decision"],
        "Sale requests by activity and decision (contract code, or admitted).";
    /// Units reserved in each phase of a sale in phases.
    phase_units: IntCounterVec = "flashgate_phase_units_total" ["activity", "phase"],
        "Units reserved in each phase of a sale in phases (phase: a phases[].id, or public after them), counted by the gateway that reserved them.";
    /// Buyers waiting in an activity's second-chance line(s).
    line_waiting: IntGaugeVec = "flashgate_line_waiting" ["activity"],
        "Buyers waiting in the activity's second-chance line (all its variants), as this gateway last moved it on.";
    /// Units held for the first buyers of an activity's line(s).
    line_held: IntGaugeVec = "flashgate_line_held" ["activity"],
        "Units that came back held for the first buyers of the activity's second-chance line (all its variants), as this gateway last moved it on.";
    /// Units left in the current version, as last seen in Redis.
    stock_remaining: IntGaugeVec = "flashgate_stock_remaining" ["activity"],
        "Units left in the current stock version, as last seen in Redis.";
    /// The same, per variant of an activity with variants: exported as
    /// `flashgate_stock_remaining{activity, variant}` (see [`Metrics::encode`]).
    stock_remaining_variants: IntGaugeVec = "flashgate_stock_remaining_by_variant" ["activity", "variant"],
        "Units left in the current stock version, as last seen in Redis.";
    /// Round trip of one script call.
    script_duration: HistogramVec = "flashgate_redis_script_duration_seconds" ["script"]
        buckets SCRIPT_BUCKETS, "Round trip of one Lua script call to the stock store.";
    /// Units added by the restock call.
    restocked_units: IntCounterVec = "flashgate_restocked_units_total" ["activity"],
        "Units an operator added to the version on sale (POST /v1/activities/{act}/restock).";
    /// Items per script call of the scripts that take batches.
    script_batch_size: HistogramVec = "flashgate_redis_script_batch_size" ["script"]
        buckets BATCH_BUCKETS,
        "Items carried by one call of a batched Lua script (reserve, confirm).";
    /// Backend answers by class.
    upstream_responses: IntCounterVec = "flashgate_upstream_responses_total" ["class"],
        "Upstream answers by class (2xx, 4xx, 5xx, error).";
    /// Reservations given back, by reason.
    reservations_released: IntCounterVec = "flashgate_reservations_released_total"
        ["activity", "reason"], "Reservations whose units were given back, by reason.";
    /// Failed or timed-out stock-store calls, by operation.
    redis_errors: IntCounterVec = "flashgate_redis_errors_total" ["op"],
        "Stock-store calls that failed or timed out, by operation.";
    /// Fate writes (confirm, release, sweep) `redis.ack_replicas` replicas did not acknowledge
    /// in time, or whose answer was lost: kept and sent again by the gateway.
    unacknowledged_writes: IntCounterVec = "flashgate_redis_unacknowledged_writes_total" ["script"],
        "Writes deciding units' fate (confirm, release, sweep) that fewer than redis.ack_replicas replicas acknowledged in time, or whose answer was lost: kept and sent again; while any is kept, a promoted replica stays fenced until an operator resumes it.";
    /// Versions put on sale by prewarm (per segment).
    stock_keys_created: IntCounterVec = "flashgate_stock_keys_created_total" ["activity"],
        "Stock versions created by prewarm (stock key and ledger, created once).";
    /// Token buckets held in memory (all limits).
    rate_limiter_keys: IntGauge = "flashgate_rate_limiter_keys" [],
        "Token buckets held in memory (per user, per IP, per activity).";
    /// Refusals by bucket; `shadow` ones were counted but admitted.
    rate_limit_refusals: IntCounterVec = "flashgate_rate_limit_refusals_total" ["limit", "mode"],
        "Requests a token bucket refused, by bucket; mode=shadow were admitted anyway.";
    /// Reservations confirmed, by who confirmed them.
    reservations_confirmed: IntCounterVec = "flashgate_reservations_confirmed_total"
        ["activity", "via"],
        "Reservations confirmed, by who confirmed them (upstream 2xx, admin API, order lookup).";
    /// Released reservations whose version was no longer on sale (units retired).
    reservations_retired: IntCounterVec = "flashgate_reservations_retired_total" ["activity"],
        "Released reservations whose stock version no longer existed (units retired, not put back on sale).";
    /// Requests refused at the edge before routing (any route), by why.
    edge_refusals: IntCounterVec = "flashgate_edge_refusals_total" ["reason"],
        "Requests refused (400) before routing, on any route: targets that cannot be read, and look-alikes of a sale route.";
    /// Units the backend accepted after their reservation was released (an oversell the gateway
    /// can see), by whether a unit of stock covered them.
    late_accepted: IntCounterVec = "flashgate_late_accepted_units_total" ["activity", "outcome"],
        "Units the backend accepted (2xx, or its order lookup) after their reservation was released: covered by a unit of stock, or oversold.";
    /// Units not accounted for, summed over versions and segments.
    reconcile_drift: IntGaugeVec = "flashgate_reconcile_drift" ["activity"],
        "Units not accounted for: initial - (remaining + pending + confirmed + retired), summed over versions.";
    /// Units pending and held in doubt (the ledgers' `held_in_doubt`), summed over versions,
    /// segments and variants: off sale until a confirm, a release or the order lookup settles
    /// them. Refreshed with `flashgate_reconcile_drift`, from the same ledger reads.
    units_held_in_doubt: IntGaugeVec = "flashgate_units_held_in_doubt" ["activity"],
        "Units of reservations pending and held in doubt (pending through a Redis fence or loss: their hold's expiry never releases them), summed over versions, segments and variants; off sale until confirmed, released or settled by the order lookup (reconcile --orders --confirm-pending).";
    /// Configuration reloads, by result.
    config_reloads: IntCounterVec = "flashgate_config_reloads_total" ["result"],
        "Configuration reloads, by result (applied, or refused and the running configuration kept).";
    /// The configuration generation running: 1 at start, +1 per applied reload.
    config_generation: IntGauge = "flashgate_config_generation" [],
        "The configuration generation running: 1 at start, +1 per applied reload.";
    /// 1 for the breaker's state, 0 for the others.
    breaker_state: IntGaugeVec = "flashgate_redis_breaker_state" ["state"],
        "Stock-store circuit breaker: 1 for its current state (closed, open, half_open).";
    /// 1 for the admin switch's position.
    breaker_mode: IntGaugeVec = "flashgate_redis_breaker_mode" ["mode"],
        "The breaker's admin switch: 1 for auto, forced_open or forced_closed.";
    /// Times the breaker opened on failures.
    breaker_opened: IntCounter = "flashgate_redis_breaker_opened_total" [],
        "Times the stock-store breaker opened after consecutive failures.";
    /// Sale requests met by a failed store on a passthrough activity.
    passthrough: IntCounterVec = "flashgate_store_failure_passthrough_total" ["activity", "outcome"],
        "Sale requests met by a failed store on a passthrough activity: forwarded unreserved, or capped.";
    /// Forwarded sale requests holding an upstream slot.
    upstream_inflight: IntGauge = "flashgate_upstream_inflight" [],
        "Forwarded sale requests holding an upstream slot (upstream.max_inflight).";
    /// Winners waiting for an upstream slot.
    upstream_queue_depth: IntGauge = "flashgate_upstream_queue_depth" [],
        "Winners waiting in the FIFO for an upstream slot.";
    /// Time winners waited for a slot, whether they got one or not.
    upstream_queue_wait: Histogram = "flashgate_upstream_queue_wait_seconds" []
        buckets QUEUE_BUCKETS,
        "Time winners waited for an upstream slot, whether they got one or timed out.";
    /// Reservations held by requests not finished yet.
    reservations_in_flight: IntGauge = "flashgate_reservations_in_flight" [],
        "Reservations held by requests still in progress (not yet answered by the upstream or released).";
    /// The backend's answers to order lookups.
    order_lookups: IntCounterVec = "flashgate_order_lookups_total" ["activity", "result"],
        "Order lookups before a reservation expires: found (confirmed), not_found (released), unanswered (kept pending, asked again).";
    /// 1 while Redis's record of an activity refuses its configuration: not on sale.
    activity_refused: IntGaugeVec = "flashgate_activity_refused" ["activity"],
        "1 while Redis's record of an activity refuses its configuration (not on sale): segments changed, an older version, an older key layout, a lost key.";
    /// Fleet-wide bucket decisions made by the gateway's own bucket (Redis slow or down).
    rate_limit_fleet_fallbacks: IntCounterVec = "flashgate_rate_limit_fleet_fallbacks_total" ["limit"],
        "Decisions of a fleet-wide bucket (rate_limits scope: fleet) made by this gateway's own bucket because Redis did not answer in time (N gateways then allow up to N times the rate).";
    /// 1 while an activity is halted for the whole fleet (admin API), as this gateway knows it.
    activity_halted: IntGaugeVec = "flashgate_activity_halted" ["activity"],
        "1 while an activity is halted for the whole fleet (POST /v1/activities/{act}/halt): its sale requests are answered unavailable until resumed.";
    /// 1 while an activity is fenced: its Redis master changed under it.
    activity_fenced: IntGaugeVec = "flashgate_activity_fenced" ["activity"],
        "1 while an activity is fenced: the Redis master its stock was accepted under was replaced (a replica promoted, a restart under a new replication id); it sells nothing until reconciled and resumed.";
    /// Fences lifted, by the rule or the call that lifted them.
    fence_lifted: IntCounterVec = "flashgate_fence_lifted_total" ["reason"],
        "Failover fences lifted, by why: durable_restart (the same server, appendfsync always, holding every record), replicas_acknowledged (a promoted replica every winner was acknowledged by, redis.ack_replicas), same_process (the master's own process gave itself a new replication id, as on its first replica), resume (an operator's POST .../resume), recount (a resume with the counted remaining stock).";
    /// 1 when Redis may evict keys (maxmemory-policy not noeviction), 0 when not, -1 unknown.
    redis_may_evict: IntGauge = "flashgate_redis_may_evict" [],
        "1 when Redis's maxmemory-policy may evict flashgate's keys (anything but noeviction; a lost key can sell units twice), 0 when noeviction, -1 unknown.";
    /// Waiting-room tickets issued (one per user and activity).
    queue_tickets: IntCounterVec = "flashgate_queue_tickets_total" ["activity"],
        "Waiting-room tickets issued (one per user and activity), counted by the gateway that issued each.";
    /// Tickets issued and not yet reached by the cursor.
    queue_length: IntGaugeVec = "flashgate_queue_length" ["activity"],
        "Waiting-room tickets issued and not yet reached by the serving cursor, as this gateway last read it.";
    /// Places the serving cursor admitted.
    queue_cursor: IntGaugeVec = "flashgate_queue_cursor" ["activity"],
        "The waiting room's serving cursor (places admitted so far, fleet-wide), as this gateway last read it.";
    /// The sale's start: the cursor runs from here.
    queue_start_time: IntGaugeVec = "flashgate_queue_start_time_seconds" ["activity"],
        "When the waiting room's cursor starts (the sale's start, unix seconds).";
    /// 1 while an operator paused the cursor, or nothing is left and it is held.
    queue_paused: IntGaugeVec = "flashgate_queue_paused" ["activity", "why"],
        "1 while the waiting room's cursor stands: why=operator (paused) or why=sold_out (held until units come back).";
    /// Tickets admitted to the purchase (the first purchase each made through this gateway).
    queue_admitted: IntCounterVec = "flashgate_queue_admitted_total" ["activity"],
        "Waiting-room tickets admitted to the purchase, counted once by each gateway that saw them buy.";
    /// Time from ticket to admission.
    queue_wait: HistogramVec = "flashgate_queue_wait_seconds" ["activity"]
        buckets WAIT_BUCKETS,
        "Time from a ticket's issue to its first purchase (by Redis's clock).";
    /// Purchases refused because the ticket's admission window had passed.
    queue_lapsed: IntCounterVec = "flashgate_queue_lapsed_total" ["activity"],
        "Purchases with a waiting-room ticket whose admission window had passed (410 ticket_expired).";
    /// New tickets told they are very likely too late.
    queue_too_late: IntCounterVec = "flashgate_queue_too_late_total" ["activity"],
        "New waiting-room tickets whose place was already behind the units left (times too_late_factor).";
    /// Poll answers (`GET /flashgate/queue/{activity}`).
    queue_polls: IntCounterVec = "flashgate_queue_polls_total" ["activity"],
        "Waiting-room polls answered (GET /flashgate/queue/{activity}).";
    /// Proof-of-work challenges before a ticket, by outcome.
    queue_challenges: IntCounterVec = "flashgate_queue_challenges_total" ["activity", "outcome"],
        "Waiting-room proof-of-work challenges: issued, solved (a ticket given for a solution), refused (a wrong, forged, other user's, expired or spent solution), shadow_passed (shadow mode: a ticket given without a valid solution).";
}

impl Metrics {
    /// Prometheus text exposition of flashgate's metrics and anything registered globally
    /// (Pingora's own, if any).
    pub fn encode(&self) -> Vec<u8> {
        let mut families = self.registry.gather();
        merge_variant_stock(&mut families);
        families.extend(prometheus::gather());
        let mut out = Vec::with_capacity(8 * 1024);
        TextEncoder::new()
            .encode(&families, &mut out)
            .expect("text encoding to a Vec cannot fail");
        #[cfg(feature = "dhat-heap")]
        {
            let stats = dhat::HeapStats::get();
            out.extend_from_slice(
                format!(
                    "flashgate_debug_heap_allocations_total {}\nflashgate_debug_heap_bytes_total {}\n",
                    stats.total_blocks, stats.total_bytes
                )
                .as_bytes(),
            );
        }
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
        // Families with labels show up in the text once they have a series.
        metrics.decisions.with_label_values(&["1001", "admitted"]);
        for family in [
            &metrics.upstream_responses,
            &metrics.redis_errors,
            &metrics.config_reloads,
            &metrics.edge_refusals,
            &metrics.fence_lifted,
        ] {
            family.with_label_values(&["x"]);
        }
        for family in [
            &metrics.reservations_released,
            &metrics.reservations_confirmed,
            &metrics.rate_limit_refusals,
            &metrics.passthrough,
            &metrics.order_lookups,
            &metrics.late_accepted,
        ] {
            family.with_label_values(&["x", "y"]);
        }
        for family in [
            &metrics.stock_remaining,
            &metrics.reconcile_drift,
            &metrics.units_held_in_doubt,
            &metrics.breaker_state,
            &metrics.breaker_mode,
            &metrics.activity_refused,
            &metrics.activity_halted,
            &metrics.activity_fenced,
        ] {
            family.with_label_values(&["x"]);
        }
        for family in [
            &metrics.queue_tickets,
            &metrics.queue_admitted,
            &metrics.queue_lapsed,
            &metrics.queue_too_late,
            &metrics.queue_polls,
            &metrics.rate_limit_fleet_fallbacks,
        ] {
            family.with_label_values(&["x"]);
        }
        for family in [
            &metrics.queue_length,
            &metrics.queue_cursor,
            &metrics.queue_start_time,
        ] {
            family.with_label_values(&["x"]);
        }
        metrics.queue_paused.with_label_values(&["x", "y"]);
        metrics.queue_challenges.with_label_values(&["x", "y"]);
        metrics.queue_wait.with_label_values(&["x"]).observe(1.0);
        metrics.stock_keys_created.with_label_values(&["x"]);
        metrics.reservations_retired.with_label_values(&["x"]);
        metrics.restocked_units.with_label_values(&["x"]);
        metrics
            .script_batch_size
            .with_label_values(&["x"])
            .observe(1.0);
        metrics
            .script_duration
            .with_label_values(&["x"])
            .observe(0.1);
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
}
