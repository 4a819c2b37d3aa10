//! Shared state of one gateway process: what every request and background task reads.

use crate::admission::Admission;
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::proxy::upstream::Upstreams;
use crate::reservation::Signer;
use crate::stock::StockStore;
use std::sync::Arc;

pub struct Gateway {
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    pub store: Arc<StockStore>,
    pub admission: Admission,
    pub signer: Signer,
    pub upstreams: Upstreams,
}

impl Gateway {
    pub fn new(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        store: Arc<StockStore>,
        upstreams: Upstreams,
    ) -> Gateway {
        for activity in settings.activities.iter() {
            metrics.init_activity(&activity.id);
        }
        Gateway {
            admission: Admission::new(settings.clone(), store.clone(), metrics.clone()),
            signer: Signer::new(&settings.signing),
            settings,
            metrics,
            store,
            upstreams,
        }
    }
}
