//! Shared state of one gateway process: what every request and background task reads.

use crate::admission::sold_out::SoldOutCache;
use crate::admission::Admission;
use crate::config::Settings;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::proxy::upstream::Upstreams;
use crate::reservation::Signer;
use crate::stock::StockStore;
use std::sync::Arc;

pub struct Gateway {
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    pub store: Arc<StockStore>,
    /// This instance's sold-out marks, shared by admission, the lifecycle and the news listener.
    pub sold_out: Arc<SoldOutCache>,
    pub admission: Admission,
    pub lifecycle: Arc<Lifecycle>,
    pub signer: Signer,
    pub upstreams: Upstreams,
    /// Test-only fault point (feature `fault-injection`, env `FLASHGATE_FAULT`).
    #[cfg(feature = "fault-injection")]
    pub fault: Option<Fault>,
}

/// Faults the test suite can make a gateway commit.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// After a successful reserve, never forward (as if the process died right there; the test
    /// then SIGKILLs it).
    HangAfterReserve,
}

impl Gateway {
    /// Whether a 2xx from the upstream confirms this reservation (activity `confirm: upstream`).
    pub fn confirms_on_upstream(&self, reservation: &crate::reservation::Reservation) -> bool {
        self.settings
            .activities
            .get(&reservation.activity)
            .is_some_and(|a| a.confirm == crate::config::ConfirmMode::Upstream)
    }

    pub fn new(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        store: Arc<StockStore>,
        upstreams: Upstreams,
    ) -> Gateway {
        for activity in settings.activities.iter() {
            metrics.init_activity(&activity.id);
        }
        let sold_out = Arc::new(SoldOutCache::new(settings.sold_out_cache.ttl));
        Gateway {
            admission: Admission::new(
                settings.clone(),
                store.clone(),
                metrics.clone(),
                sold_out.clone(),
            ),
            lifecycle: Arc::new(Lifecycle::new(
                settings.clone(),
                store.clone(),
                metrics.clone(),
                sold_out.clone(),
            )),
            sold_out,
            signer: Signer::new(&settings.signing),
            settings,
            metrics,
            store,
            upstreams,
            #[cfg(feature = "fault-injection")]
            fault: match std::env::var("FLASHGATE_FAULT").as_deref() {
                Ok("hang_after_reserve") => Some(Fault::HangAfterReserve),
                _ => None,
            },
        }
    }
}
