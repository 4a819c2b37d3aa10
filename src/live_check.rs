//! `flashgate check --live`: the configuration judged against Redis's record of every activity,
//! by the judgement a reload makes against the running configuration
//! ([`crate::config::transition::judge`]), so what `check --live` accepts a reload accepts
//! too, and the reverse: an older version, a stock change under the same version, a changed
//! segment count are refused, named by activity id. A restock is not a stock change: the
//! record's stock is the version's configured one, without the units added since.

use crate::config::{ConfigError, Settings};
use crate::reconcile::{with_store, ReconcileError};
use crate::stock::segments::recorded;
use std::time::Duration;

/// How long the second look at a Redis that did not answer waits for a connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What `check --live` found: the activities Redis's record refuses (the file is refused),
/// and what the SRE should know without refusing it (a queue start Redis does not follow).
#[derive(Debug, Default)]
pub struct Verdict {
    pub refused: Vec<ConfigError>,
    pub warnings: Vec<crate::waiting::start::StartNote>,
}

/// Every activity whose configuration Redis's record refuses (empty: all agree). When Redis
/// could not be read (a timeout, or redis-rs's own connection error, whichever came first) it
/// is looked at once more, so that one refusing connections is named as such rather than as
/// slow to answer.
pub fn run_cli(settings: &Settings) -> Result<Verdict, ReconcileError> {
    match judge_all(settings) {
        Err(ReconcileError::Store(e)) => Err(match refused(settings) {
            Some(addresses) => ReconcileError::Refused(addresses),
            None => ReconcileError::Store(e),
        }),
        other => other,
    }
}

/// The addresses (no credentials) when every configured Redis address refuses a connection;
/// `None` when one accepts, or fails another way (a timeout, a TLS or auth error).
fn refused(settings: &Settings) -> Option<String> {
    let urls = match settings.redis.cluster_nodes.as_slice() {
        [] => std::slice::from_ref(&settings.redis.url),
        nodes => nodes,
    };
    let mut addresses = Vec::with_capacity(urls.len());
    for url in urls {
        let client = redis::Client::open(url.as_str()).ok()?;
        match client.get_connection_with_timeout(PROBE_TIMEOUT) {
            Err(e) if e.is_connection_refusal() => {
                addresses.push(client.get_connection_info().addr().to_string());
            }
            _ => return None,
        }
    }
    Some(addresses.join(", "))
}

fn judge_all(settings: &Settings) -> Result<Verdict, ReconcileError> {
    with_store(settings, async |store| {
        let mut refused = Vec::new();
        for activity in settings.activities.iter() {
            // Each stock lane (the activity, or each of its variants) against its record; a
            // variant with none, of a version another variant already sells, was added under
            // that version (a variant removed from the YAML is not seen here: a reload's
            // judgement against the running configuration refuses that).
            let mut unknown = Vec::new();
            let mut sold_versions = Vec::new();
            for lane in settings.activities.lanes_of(&activity.id) {
                match recorded(store, lane).await? {
                    Some(known) => {
                        sold_versions.push(known.version);
                        if let Err(e) = crate::config::transition::judge(lane, &known) {
                            refused.push(e);
                        }
                    }
                    None => unknown.push(lane),
                }
            }
            if activity.has_variants() && sold_versions.contains(&activity.version) {
                for lane in unknown {
                    refused.push(crate::ConfigError::invalid(
                        crate::config::transition::activity_key(&activity.id, "variants"),
                        format!(
                            "variant {} added under version {}, which is on sale already: a \
                             change of the variants is a stock change; raise version",
                            lane.variant.as_deref().unwrap_or_default(),
                            activity.version
                        ),
                    ));
                }
            }
        }
        let asker = crate::waiting::start::Asker::Check;
        let warnings =
            crate::waiting::start::notes(store, settings.activities.iter().map(|a| &**a), asker)
                .await?;
        Ok(Verdict { refused, warnings })
    })
}
