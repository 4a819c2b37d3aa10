//! Whether a configured activity may follow what is already known of it: the one judgement a
//! reload makes against the running configuration and `flashgate check --live` makes against
//! Redis's record, so the two cannot disagree. And the one way an activity is named in an
//! error: by its id.

use super::{Activity, ConfigError};

pub use super::naming::activity_key;

/// What is known of an activity already sold: its newest version, that version's stock as
/// configured when it went on sale (units added by a restock are not part of it: a restock is
/// not a stock change), and its segment count. `None`: not known (Redis keeps the floor of a
/// sale whose other keys expired, but no longer its stock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub version: u64,
    pub stock: Option<u64>,
    pub segments: Option<u32>,
}

impl Recorded {
    /// What a running configuration says of its activity.
    pub fn of(activity: &Activity) -> Recorded {
        Recorded {
            version: activity.version,
            stock: Some(activity.stock),
            segments: Some(activity.segments),
        }
    }
}

/// Refuses a configuration that would break a sale already made: a stock version is created
/// once from `stock`, so changing it needs a new version; going back to an older version would
/// sell its leftover units again; and the segment count is fixed for the life of the activity's
/// keys. `known` is what the running gateway (a reload) or Redis (`check --live`) holds.
///
/// `next` may be a variant's stock lane: its stock is then named
/// `activities[id=…].variants[id=…].stock`.
pub fn judge(next: &Activity, known: &Recorded) -> Result<(), ConfigError> {
    let key = |field: &str| activity_key(&next.id, field);
    let stock_key = match &next.variant {
        Some(v) => activity_key(&next.id, &format!("variants[id={v}].stock")),
        None => key("stock"),
    };
    if next.version < known.version {
        return Err(ConfigError::invalid(
            key("version"),
            format!(
                "{} is lower than the version on record, {}; a version can only go up",
                next.version, known.version
            ),
        ));
    }
    if let Some(stock) = known.stock {
        if next.version == known.version && next.stock != stock {
            return Err(ConfigError::invalid(
                stock_key,
                format!(
                    "changed from {stock} to {} under the same version {}; a version's stock is fixed once created: raise version to restock (or add units with POST /v1/activities/{}/restock)",
                    next.stock, next.version, next.id
                ),
            ));
        }
    }
    if let Some(segments) = known.segments.filter(|s| *s != next.segments) {
        return Err(ConfigError::invalid(
            key("segments"),
            format!(
                "changed from {segments} to {}; an activity's segment count is fixed for the life of its keys (a buyer's units and idempotency keys live in their segment): keep {segments}, or sell under a new activity id",
                next.segments
            ),
        ));
    }
    Ok(())
}

/// A reload's judgement of an activity with variants (or one that gains or loses them) against
/// the running one: the version and segments as for any activity, and under the same version
/// the same variants with the same stock (adding, removing or changing one is a stock change).
pub fn judge_variants(next: &Activity, running: &Activity) -> Result<(), ConfigError> {
    judge(
        next,
        &Recorded {
            stock: None,
            ..Recorded::of(running)
        },
    )?;
    if next.version != running.version {
        return Ok(());
    }
    let raise = |what: String| {
        ConfigError::invalid(
            activity_key(&next.id, "variants"),
            format!(
                "{what} under the same version {}: a change of the variants is a stock change; \
                 raise version to sell the new set",
                next.version
            ),
        )
    };
    if next.has_variants() != running.has_variants() {
        return Err(raise(if next.has_variants() {
            "variants given instead of stock".to_owned()
        } else {
            "stock given instead of variants".to_owned()
        }));
    }
    for v in running.variants.iter() {
        match next.variants.iter().find(|n| n.id == v.id) {
            None => return Err(raise(format!("variant {} removed", v.id))),
            Some(n) if n.stock != v.stock => {
                return Err(ConfigError::invalid(
                    activity_key(&next.id, &format!("variants[id={}].stock", v.id)),
                    format!(
                        "changed from {} to {} under the same version {}; a version's stock is \
                         fixed once created: raise version to restock (or add units with POST \
                         /v1/activities/{}/restock and its \"variant\")",
                        v.stock, n.stock, next.version, next.id
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    match next
        .variants
        .iter()
        .find(|n| !running.variants.iter().any(|v| v.id == n.id))
    {
        Some(added) => Err(raise(format!("variant {} added", added.id))),
        None => Ok(()),
    }
}
