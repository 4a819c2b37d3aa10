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
        phases: std::sync::Arc::from(Vec::new()),
        second_chance: None,
    }
}

/// The Redis settings the store tests use: `url` (or `cluster_nodes`), `timeout`, keys kept
/// `key_ttl_after_end` past a sale's end.
pub fn redis_settings(
    url: String,
    cluster_nodes: Vec<String>,
    timeout: Duration,
    key_ttl_after_end: Duration,
) -> flashgate::config::RedisSettings {
    flashgate::config::RedisSettings {
        url,
        cluster_nodes,
        timeout,
        key_prefix: "fg".into(),
        key_ttl_after_end,
        prewarm_interval: Duration::from_secs(5),
        sweep_interval: Duration::from_secs(1),
        sweep_batch: 100,
        reconcile_interval: Duration::from_secs(10),
        events_maxlen: 1000,
        allow_eviction: false,
        ack_replicas: 0,
    }
}

/// A stock store on a single Redis (`cluster_nodes` empty) or a cluster.
pub fn stock_store(
    url: String,
    cluster_nodes: Vec<String>,
    timeout: Duration,
) -> flashgate::stock::StockStore {
    let day = Duration::from_secs(86_400);
    store_of(&redis_settings(url, cluster_nodes, timeout, day))
}

/// A stock store on `settings`, with no birth hold: these tests drive the scripts without a
/// gateway's periodic master checks (the gateway binary holds; tests/doubt.rs and tests/e2e
/// show the hold).
pub fn store_of(settings: &flashgate::config::RedisSettings) -> flashgate::stock::StockStore {
    let metrics = std::sync::Arc::new(flashgate::metrics::Metrics::new());
    flashgate::stock::StockStore::new(settings, metrics)
        .unwrap()
        .with_birth_hold(Duration::ZERO)
}
