//! Fleet-wide token buckets (`rate_limits.per_user` / `per_ip` with `scope: fleet`): one bucket
//! per user (or IP) for all gateways together, so N gateways allow the configured rate, not N
//! times it.
//!
//! Design: the bucket lives in Redis (GCRA: one arrival time per key, `lua/tokens.lua`, Redis's
//! clock), and a gateway asks it for each token it grants, but never one at a time: the asks
//! that arrive while a call is out go together in the next call (one call per batch of
//! decisions, up to 64, per shard; [`crate::coalesce::Batcher`]). Every answer carries when the
//! bucket will grant its next token, and until then this gateway refuses that key from memory,
//! without asking. So a buyer spraying requests over the fleet costs about one call per gateway
//! per token the fleet grants (a little more when several of their requests reach one gateway
//! at once: they ask together), whatever their request rate; refusals are free. Measured with
//! three gateways (tests/e2e/fleet_limits.rs): 0.08 calls per request, within 1 % of the rate.
//!
//! Why not local leases or Kong-style periodic sync: both decide from a count that is up to a
//! sync period old, so N gateways admit up to N times a period's tokens before they learn, and
//! the error grows with the fleet and with small rates (5 a second per user). Asking Redis for
//! each granted token is exact, and batching keeps the calls per request low where it matters:
//! under load, when many decisions wait together.
//!
//! Approximations, on purpose:
//! - The grant is exact GCRA (the same as the instance buckets' governor): a token not asked
//!   for when it became available is not saved up beyond the burst. The time between a token
//!   becoming available and the next ask is lost, as with any bucket.
//! - An empty bucket is remembered here until the time Redis named, and the key's asks on this
//!   gateway are refused meanwhile without a call: an arrival time only moves later, so Redis
//!   would refuse them too (a reload that raises the rate is heard from the next answer on).
//! - Redis slow or down (no answer within `redis.timeout_ms`): this gateway's own bucket of the
//!   same quota decides (so N gateways allow up to N times the rate meanwhile, never more, never
//!   unlimited), and for [`FAILURE_BACKOFF`] after a failure it decides alone without asking.
//!   Every token the fleet grants is also taken from the gateway's own bucket, so falling back
//!   does not hand a buyer a fresh burst.
//! - A token granted in Redis whose answer timed out here is lost (the bucket is stricter, not
//!   looser, for a moment).

use super::rate_limit::KeyedRateLimiter;
use super::LimitKind;
use crate::metrics::Metrics;
use crate::stock::scripts::tokens::{TokenAsk, Tokens};
use crate::stock::{stable_hash, StockStore, StoreError};
use moka::sync::Cache;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
// Tokio's clock: the process's monotonic clock, which tests can pause and advance.
use tokio::time::Instant;

/// How long after a failed or slow call this gateway's own buckets decide without asking Redis.
pub const FAILURE_BACKOFF: Duration = Duration::from_secs(1);

/// Keys whose bucket is known empty, per process (each entry about 40 bytes).
const REFUSED_CAPACITY: u64 = 1_000_000;

/// The store calls fleet buckets make: Redis in the gateway, a fake in the unit tests.
#[async_trait::async_trait]
pub trait FleetTokens: Send + Sync + 'static {
    /// The most one ask may take before this gateway falls back.
    fn budget(&self) -> Duration;
    /// One token asked of a bucket (batched with others by the store).
    async fn take(&self, ask: TokenAsk) -> Result<Tokens, StoreError>;
}

#[async_trait::async_trait]
impl FleetTokens for StockStore {
    fn budget(&self) -> Duration {
        self.timeout()
    }

    async fn take(&self, ask: TokenAsk) -> Result<Tokens, StoreError> {
        self.take_token(ask).await
    }
}

/// The fleet's buckets as this gateway asks them.
pub struct FleetBuckets {
    store: Arc<dyn FleetTokens>,
    metrics: Arc<Metrics>,
    /// Keys whose bucket Redis said is empty, with when a token will be there (this process's
    /// monotonic clock).
    empty: Cache<(LimitKind, u64), Instant>,
    /// Until when this gateway's own buckets decide alone (Redis failed or was slow).
    alone_until: Mutex<Option<Instant>>,
}

impl FleetBuckets {
    pub fn new(store: Arc<dyn FleetTokens>, metrics: Arc<Metrics>) -> FleetBuckets {
        FleetBuckets {
            store,
            metrics,
            empty: Cache::builder()
                .max_capacity(REFUSED_CAPACITY)
                .time_to_live(Duration::from_secs(60))
                .build(),
            alone_until: Mutex::new(None),
        }
    }

    /// Takes a token of `kind`'s fleet bucket for `key` (see the module's doc), or says how long
    /// until one is there; `own` is this gateway's bucket of the same quota (the fallback).
    pub async fn check(
        &self,
        kind: LimitKind,
        quota: governor::Quota,
        key: &str,
        own: &KeyedRateLimiter,
    ) -> Result<(), Duration> {
        let hash = stable_hash(key);
        let now = Instant::now();
        if let Some(until) = self.empty.get(&(kind, hash)).filter(|u| *u > now) {
            return Err(until - now);
        }
        if self.alone_until.lock().is_some_and(|until| until > now) {
            return self.fall_back(kind, key, own);
        }
        let ask = TokenAsk {
            kind: kind.as_str(),
            hash,
            interval_us: quota.replenish_interval().as_micros().max(1) as u64,
            burst: quota.burst_size().get(),
        };
        let asked = self.store.take(ask);
        match tokio::time::timeout(self.store.budget(), asked).await {
            Ok(Ok(answer)) => {
                if answer.next_in_us > 0 {
                    // From the answer's arrival: Redis measured the wait between the ask and
                    // now, so it ends here at most a round trip late (never early: an early
                    // ask would only be refused again).
                    let until = Instant::now() + Duration::from_micros(answer.next_in_us);
                    self.empty.insert((kind, hash), until);
                }
                if !answer.granted {
                    return Err(Duration::from_micros(answer.next_in_us));
                }
                // Kept in step, so that falling back hands out no fresh burst.
                let _ = own.check(key);
                Ok(())
            }
            failed => {
                if let Ok(Err(e)) = &failed {
                    tracing::debug!(error = %e, "fleet bucket not asked");
                }
                *self.alone_until.lock() = Some(Instant::now() + FAILURE_BACKOFF);
                self.fall_back(kind, key, own)
            }
        }
    }

    /// This gateway's own bucket decides (counted).
    fn fall_back(
        &self,
        kind: LimitKind,
        key: &str,
        own: &KeyedRateLimiter,
    ) -> Result<(), Duration> {
        self.metrics
            .rate_limit_fleet_fallbacks
            .with_label_values(&[kind.as_str()])
            .inc();
        own.check(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::num::NonZeroU32;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Answer,
        Fail,
        Slow,
    }

    /// lua/tokens.lua's GCRA on tokio's (paused) clock; each call takes 1 ms.
    struct Fake {
        calls: AtomicUsize,
        mode: Mutex<Mode>,
        tats: Mutex<HashMap<(&'static str, u64), u64>>,
        start: tokio::time::Instant,
    }

    #[async_trait::async_trait]
    impl FleetTokens for Fake {
        fn budget(&self) -> Duration {
            Duration::from_millis(50)
        }
        async fn take(&self, a: TokenAsk) -> Result<Tokens, StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mode = *self.mode.lock();
            tokio::time::sleep(Duration::from_millis(if mode == Mode::Slow {
                10_000
            } else {
                1
            }))
            .await;
            if mode == Mode::Fail {
                return Err(StoreError::Timeout(Duration::from_millis(50)));
            }
            let now = self.start.elapsed().as_micros() as u64;
            let mut tats = self.tats.lock();
            let tat = tats.entry((a.kind, a.hash)).or_insert(0);
            let allowed = u64::from(a.burst) * a.interval_us;
            let next = (*tat).max(now) + a.interval_us;
            let granted = next - now <= allowed;
            if granted {
                *tat = next;
            }
            Ok(Tokens {
                granted,
                next_in_us: ((*tat).max(now) + a.interval_us - now).saturating_sub(allowed),
            })
        }
    }

    fn setup(mode: Mode) -> (Arc<Fake>, FleetBuckets, Arc<Metrics>) {
        let fake = Arc::new(Fake {
            calls: AtomicUsize::new(0),
            mode: Mutex::new(mode),
            tats: Mutex::default(),
            start: tokio::time::Instant::now(),
        });
        let metrics = Arc::new(Metrics::new());
        let buckets = FleetBuckets::new(fake.clone(), metrics.clone());
        (fake, buckets, metrics)
    }

    fn quota(per_second: u32, burst: u32) -> governor::Quota {
        governor::Quota::per_second(NonZeroU32::new(per_second).unwrap())
            .allow_burst(NonZeroU32::new(burst).unwrap())
    }

    /// Three gateways (three `FleetBuckets` on one store) sharing one buyer's bucket grant the
    /// configured rate together, not three times it; refusals are answered from memory.
    #[tokio::test(start_paused = true)]
    async fn three_gateways_share_one_bucket_and_refusals_cost_no_call() {
        let (fake, a, metrics) = setup(Mode::Answer);
        let b = FleetBuckets::new(fake.clone(), metrics.clone());
        let c = FleetBuckets::new(fake.clone(), metrics);
        let q = quota(10, 10);
        let own = KeyedRateLimiter::new(Some(q));
        let mut granted = 0;
        let mut asked = 0;
        // 10 s of a buyer asking every 2 ms, round robin over the three gateways.
        for i in 0..5_000 {
            let gw = [&a, &b, &c][i % 3];
            asked += 1;
            if gw.check(LimitKind::PerUser, q, "alice", &own).await.is_ok() {
                granted += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Each check took 1 ms of Redis or none, plus the 1 ms sleep: about 10 s in all.
        let secs = fake.start.elapsed().as_secs_f64();
        let expected = 10.0 + 10.0 * secs;
        let error = (granted as f64 - expected).abs() / expected;
        assert!(
            error < 0.05,
            "granted {granted}, expected {expected:.0} over {secs:.1} s"
        );
        let calls = fake.calls.load(Ordering::SeqCst);
        assert!(
            calls <= granted * 3 + 3,
            "{calls} calls for {granted} tokens"
        );
        assert!(calls * 5 < asked, "{calls} calls for {asked} asks");
    }

    /// Redis failing or slow: the gateway's own bucket decides (its burst, then refusals: never
    /// unlimited), counted, and the store is left alone for the back-off.
    #[tokio::test(start_paused = true)]
    async fn a_sick_redis_falls_back_to_the_instance_bucket() {
        for mode in [Mode::Fail, Mode::Slow] {
            let (fake, buckets, metrics) = setup(mode);
            let q = quota(1, 3);
            let own = KeyedRateLimiter::new(Some(q));
            let results: Vec<bool> = {
                let mut r = Vec::new();
                for _ in 0..10 {
                    r.push(
                        buckets
                            .check(LimitKind::PerIp, q, "10.0.0.1", &own)
                            .await
                            .is_ok(),
                    );
                }
                r
            };
            assert_eq!(results.iter().filter(|ok| **ok).count(), 3, "{results:?}");
            assert_eq!(
                fake.calls.load(Ordering::SeqCst),
                1,
                "asked during the back-off"
            );
            assert_eq!(
                metrics
                    .rate_limit_fleet_fallbacks
                    .with_label_values(&["per_ip"])
                    .get(),
                10
            );
            // After the back-off it asks again.
            *fake.mode.lock() = Mode::Answer;
            tokio::time::sleep(FAILURE_BACKOFF).await;
            assert!(buckets
                .check(LimitKind::PerIp, q, "10.0.0.2", &own)
                .await
                .is_ok());
            assert_eq!(fake.calls.load(Ordering::SeqCst), 2);
        }
    }
}
