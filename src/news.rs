//! Sold-out news between gateway instances (Redis pub/sub): when one instance learns that an
//! activity's stock version is at zero, every instance marks it in its sold-out cache; when
//! units come back (a release or an expiry), every instance clears the mark, so returned stock is
//! purchasable again at once instead of after `sold_out_cache.ttl_ms`.
//!
//! Messages may arrive in any order (instances publish independently) and an instance hears its
//! own. So "sold out" is not believed as such: the listener reads the stock key (one GET per
//! instance per sold-out event) and marks only if it is still at zero; "available" always clears
//! (clearing is always safe: at worst one more script call). Whatever the order, the last word is
//! what Redis said last.
//!
//! Approximations: pub/sub is fire-and-forget. A message lost while an instance is reconnecting
//! only costs that instance what it cost before news existed: a sold-out answer for up to the
//! cache TTL, or one more script call to learn it. News never admits anyone: Redis still decides.

use crate::stock::{Publish, StockStore};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// What an instance tells the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum News {
    SoldOut { activity: String, version: u64 },
    Available { activity: String, version: u64 },
}

impl News {
    pub fn encode(&self) -> String {
        match self {
            News::SoldOut { activity, version } => format!("sold_out {activity} {version}"),
            News::Available { activity, version } => format!("available {activity} {version}"),
        }
    }

    pub fn decode(raw: &str) -> Option<News> {
        let mut parts = raw.split(' ');
        let (kind, activity, version) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let activity = activity.to_owned();
        let version = version.parse().ok()?;
        match kind {
            "sold_out" => Some(News::SoldOut { activity, version }),
            "available" => Some(News::Available { activity, version }),
            _ => None,
        }
    }
}

/// Who acts on news (the lifecycle, which owns the sale state): one message at a time.
#[async_trait::async_trait]
pub trait NewsSink: Send + Sync {
    async fn news(&self, news: News);
}

/// Tells every instance, off the caller's path; a lost message costs only cache freshness.
pub fn publish<S: Publish + ?Sized + 'static>(store: &Arc<S>, news: News) {
    let store = store.clone();
    tokio::spawn(async move {
        let channel = store.news_channel();
        if let Err(e) = store.publish(&channel, &news.encode()).await {
            tracing::debug!(error = %e, "sold-out news not published");
        }
    });
}

/// Listens for news until `shutdown` says stop, reconnecting with a back-off when the
/// subscription breaks; each message goes to `sink`.
pub async fn listen(
    store: Arc<StockStore>,
    sink: Arc<dyn NewsSink>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let client = store.client().clone();
    let channel = store.keys().news_channel();
    // Listened on only to be seen alive by other gateways (a stock made after its sale opened
    // waits for them: `stock::StockStore::other_gateways_alive`).
    let presence = store.presence_channel();
    let mut backoff = Duration::from_millis(100);
    loop {
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&[&channel, &presence]).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let session = tokio::select! {
            _ = shutdown.changed() => return,
            s = subscribed => s,
        };
        match session {
            Ok(pubsub) => {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.into_on_message();
                loop {
                    let message = tokio::select! {
                        _ = shutdown.changed() => return,
                        m = messages.next() => m,
                    };
                    let Some(message) = message else { break };
                    if let Some(news) = message
                        .get_payload::<String>()
                        .ok()
                        .as_deref()
                        .and_then(News::decode)
                    {
                        sink.news(news).await;
                    }
                }
                tracing::warn!("sold-out news subscription ended; reconnecting");
            }
            Err(e) => tracing::warn!(error = %e, "cannot subscribe to sold-out news"),
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(crate::stock::RESUBSCRIBE_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn news_round_trips_and_rejects_garbage() {
        for news in [
            News::SoldOut {
                activity: "1001".into(),
                version: 3,
            },
            News::Available {
                activity: "a-b_c".into(),
                version: 1,
            },
        ] {
            assert_eq!(News::decode(&news.encode()), Some(news));
        }
        for bad in [
            "",
            "sold_out",
            "sold_out 1001",
            "sold_out 1001 x",
            "gone 1001 1",
            "sold_out 1001 1 extra",
        ] {
            assert_eq!(News::decode(bad), None, "{bad}");
        }
    }
}
