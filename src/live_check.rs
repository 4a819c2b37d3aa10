//! `flashgate check --live`: the configuration judged against Redis's record of every activity,
//! by the judgement a reload makes against the running configuration
//! ([`crate::config::transition::judge`]), so what `check --live` accepts a reload accepts
//! too, and the reverse: an older version, a stock change under the same version, a changed
//! segment count are refused, named by activity id. A restock is not a stock change: the
//! record's stock is the version's configured one, without the units added since.

use crate::config::{ConfigError, Settings};
use crate::reconcile::{with_store, ReconcileError};
use crate::stock::segments::recorded;

/// Every activity whose configuration Redis's record refuses (empty: all agree).
pub fn run_cli(settings: &Settings) -> Result<Vec<ConfigError>, ReconcileError> {
    with_store(settings, async |store| {
        let mut refused = Vec::new();
        for activity in settings.activities.iter() {
            if let Some(known) = recorded(store, activity).await? {
                if let Err(e) = crate::config::transition::judge(activity, &known) {
                    refused.push(e);
                }
            }
        }
        Ok(refused)
    })
}
