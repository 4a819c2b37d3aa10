//! Access lists of a sale in phases (`who: {list: NAME}`): sets of user ids in Redis, one per
//! activity and list (`<p>:{<act>}:access:<list>`, see `stock::keys`), loaded, shown and dropped
//! by `flashgate access`, and read by every gateway of the fleet on the buyer's path.
//!
//! Approximation: a gateway remembers each answer for [`REMEMBERED`], so a list loaded or
//! dropped is seen by every gateway within that long (a buyer on no list is never sold to
//! before the public start either way: the reserve script judges the time).

use crate::config::Activity;
use crate::stock::{Layout, StockStore, StoreError, StoreOp};
use std::sync::Arc;
use std::time::Duration;

/// How long a gateway keeps a list's answer for one buyer.
pub const REMEMBERED: Duration = Duration::from_secs(2);
/// Most answers kept.
const KEPT: u64 = 200_000;
/// User ids sent in one `SADD` by `flashgate access load`.
const LOAD_CHUNK: usize = 1_000;

/// Whether a buyer is on a list, as the phase gate asks it.
#[async_trait::async_trait]
pub trait AccessLists: Send + Sync {
    async fn on_list(
        &self,
        activity: &Activity,
        list: &str,
        user: &str,
    ) -> Result<bool, StoreError>;
}

/// The lists in Redis, each answer remembered for [`REMEMBERED`].
pub struct Lists {
    store: Arc<StockStore>,
    remembered: moka::sync::Cache<(Arc<str>, Arc<str>, String), bool>,
}

impl Lists {
    pub fn new(store: Arc<StockStore>) -> Lists {
        Lists {
            store,
            remembered: moka::sync::Cache::builder()
                .max_capacity(KEPT)
                .time_to_live(REMEMBERED)
                .build(),
        }
    }
}

/// The key of `activity`'s list `list`.
pub fn key(store: &StockStore, activity: &Activity, list: &str) -> String {
    store.keys().base(&Layout::of(activity)).access_list(list)
}

#[async_trait::async_trait]
impl AccessLists for Lists {
    async fn on_list(
        &self,
        activity: &Activity,
        list: &str,
        user: &str,
    ) -> Result<bool, StoreError> {
        let asked = (activity.id.clone(), Arc::from(list), user.to_owned());
        if let Some(on) = self.remembered.get(&asked) {
            return Ok(on);
        }
        let cmd = redis::cmd("SISMEMBER")
            .arg(key(&self.store, activity, list))
            .arg(user)
            .clone();
        let on: bool = self.store.redis().query(StoreOp::Read, &cmd).await?;
        self.remembered.insert(asked, on);
        Ok(on)
    }
}

/// Adds `users` to the list (kept until the sale's keys expire); returns how many were new.
pub async fn load(
    store: &StockStore,
    activity: &Activity,
    list: &str,
    users: &[String],
) -> Result<u64, StoreError> {
    let key = key(store, activity, list);
    let mut added = 0;
    for chunk in users.chunks(LOAD_CHUNK) {
        let cmd = redis::cmd("SADD").arg(&key).arg(chunk).clone();
        added += store.redis().query::<u64>(StoreOp::Read, &cmd).await?;
    }
    let expire = redis::cmd("EXPIREAT")
        .arg(&key)
        .arg(store.expire_at(activity))
        .clone();
    store.redis().query::<i64>(StoreOp::Read, &expire).await?;
    Ok(added)
}

/// How many user ids the list holds, and up to `sample` of them.
pub async fn show(
    store: &StockStore,
    activity: &Activity,
    list: &str,
    sample: usize,
) -> Result<(u64, Vec<String>), StoreError> {
    let key = key(store, activity, list);
    let count: u64 = store
        .redis()
        .query(StoreOp::Read, redis::cmd("SCARD").arg(&key))
        .await?;
    let mut some: Vec<String> = store
        .redis()
        .query(
            StoreOp::Read,
            redis::cmd("SRANDMEMBER").arg(&key).arg(sample),
        )
        .await?;
    some.sort();
    Ok((count, some))
}

/// Removes the list; returns whether there was one.
pub async fn drop_list(
    store: &StockStore,
    activity: &Activity,
    list: &str,
) -> Result<bool, StoreError> {
    let key = key(store, activity, list);
    let removed: u64 = store
        .redis()
        .query(StoreOp::Read, redis::cmd("DEL").arg(&key))
        .await?;
    Ok(removed > 0)
}

/// What `flashgate access` does to a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Adds the user ids of a file (one a line; blank lines skipped).
    Load(String),
    Show,
    Drop,
}

/// Why `flashgate access` did nothing.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("activity {0:?} is not configured")]
    UnknownActivity(String),
    #[error("activity {activity:?} has no phase with list {list:?} (phases[].who.list)")]
    UnknownList { activity: String, list: String },
    #[error("line {line}: {id:?} is not a user id (1 to 128 visible ASCII characters or spaces)")]
    BadUserId { line: usize, id: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The user ids of a list file: one a line, surrounding whitespace trimmed, blank lines
/// skipped, each checked as the gateway checks a user id; refused whole at the first bad one.
pub fn user_ids(text: &str) -> Result<Vec<String>, AccessError> {
    let mut ids = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let id = line.trim();
        if id.is_empty() {
            continue;
        }
        let valid = id.len() <= crate::client_policy::identity::MAX_USER_ID_LEN
            && id.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
        if !valid {
            return Err(AccessError::BadUserId {
                line: n + 1,
                id: id.chars().take(80).collect(),
            });
        }
        ids.push(id.to_owned());
    }
    ids.sort();
    ids.dedup();
    Ok(ids)
}

/// `flashgate access`: does `action` to `activity`'s list `list`, on a store of its own; the
/// text to print.
pub fn run_cli(
    settings: &crate::Settings,
    activity: &str,
    list: &str,
    action: Action,
) -> Result<String, AccessError> {
    let act = settings
        .activities
        .get(activity)
        .cloned()
        .ok_or_else(|| AccessError::UnknownActivity(activity.to_owned()))?;
    let named = act
        .phases
        .iter()
        .any(|p| matches!(&p.who, crate::config::Who::List(l) if &**l == list));
    if !named {
        return Err(AccessError::UnknownList {
            activity: activity.to_owned(),
            list: list.to_owned(),
        });
    }
    let users = match &action {
        Action::Load(text) => user_ids(text)?,
        _ => Vec::new(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Redis(redis::RedisError::from(e)))?;
    runtime.block_on(async {
        let store = StockStore::new(&settings.redis, Arc::new(crate::metrics::Metrics::new()))?;
        Ok(match action {
            Action::Load(_) => {
                let added = load(&store, &act, list, &users).await?;
                let (count, _) = show(&store, &act, list, 0).await?;
                format!(
                    "activity {activity}, list {list}: {} user ids read, {added} new; the list \
                     holds {count}\n",
                    users.len()
                )
            }
            Action::Show => {
                let (count, some) = show(&store, &act, list, 20).await?;
                let mut out = format!("activity {activity}, list {list}: {count} user ids\n");
                for id in some {
                    out.push_str(&format!("  {id}\n"));
                }
                if count > 20 {
                    out.push_str(&format!("  (20 of {count} shown, at random)\n"));
                }
                out
            }
            Action::Drop => match drop_list(&store, &act, list).await? {
                true => format!("activity {activity}, list {list}: dropped\n"),
                false => format!("activity {activity}, list {list}: there was no such list\n"),
            },
        })
    })
}
