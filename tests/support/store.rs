//! The stock store in process, for tests that drive the scripts without a gateway.

use super::*;

/// An activity open from 2020 to 2099, for tests that talk to the stock store directly.
pub fn store_activity(
    id: &str,
    stock: u64,
    version: u64,
    limit: u32,
    confirm: flashgate::config::ConfirmMode,
    hold: Duration,
) -> flashgate::config::Activity {
    use chrono::TimeZone;
    use std::num::NonZeroU32;
    flashgate::config::Activity {
        id: std::sync::Arc::from(id),
        lane: std::sync::Arc::from(id),
        variants: std::sync::Arc::from(Vec::new()),
        variant: None,
        stock,
        version,
        per_user_limit: NonZeroU32::new(limit).unwrap(),
        max_per_request: NonZeroU32::new(limit).unwrap(),
        starts_at: chrono::Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).unwrap(),
        ends_at: chrono::Utc.with_ymd_and_hms(2099, 1, 1, 0, 0, 0).unwrap(),
        confirm,
        on_store_failure: flashgate::config::StoreFailurePolicy::Reject,
        hold,
        segments: 1,
        queue: None,
    }
}

/// A stock store on a single Redis (`cluster_nodes` empty) or a cluster.
pub fn stock_store(
    url: String,
    cluster_nodes: Vec<String>,
    timeout: Duration,
) -> flashgate::stock::StockStore {
    let settings = flashgate::config::RedisSettings {
        url,
        cluster_nodes,
        timeout,
        key_prefix: "fg".into(),
        key_ttl_after_end: Duration::from_secs(86_400),
        prewarm_interval: Duration::from_secs(5),
        sweep_interval: Duration::from_secs(1),
        sweep_batch: 100,
        reconcile_interval: Duration::from_secs(10),
        events_maxlen: 1000,
        allow_eviction: false,
        ack_replicas: 0,
    };
    let metrics = std::sync::Arc::new(flashgate::metrics::Metrics::new());
    // No birth hold: these tests drive the scripts without a gateway's periodic master checks
    // (the gateway binary holds; tests/doubt.rs and tests/e2e show the hold).
    flashgate::stock::StockStore::new(&settings, metrics)
        .unwrap()
        .with_birth_hold(Duration::ZERO)
}
