//! The variants of a drop (`activities[].variants`), validated: each a stock of its own, bought
//! on a route that names the variant.

use super::file;
use super::settings::*;
use super::ConfigError;
use std::sync::Arc;

/// An activity's stock and its variants: `stock`, or the sum of its variants' (exactly one of
/// the two given); `key` names its fields for errors.
pub(super) fn stock_and_variants(
    a: &file::ActivitySection,
    key: &dyn Fn(&str) -> String,
) -> Result<(u64, Vec<Variant>), ConfigError> {
    let variants = variants(a, key)?;
    let stock = match (a.stock, &a.variants) {
        (Some(stock), None) => stock,
        (None, Some(_)) => variants.iter().map(|v| v.stock).sum(),
        (Some(_), Some(_)) => {
            return Err(ConfigError::invalid(
                key("variants"),
                "an activity has `stock` or `variants`, not both",
            ))
        }
        (None, None) => {
            return Err(ConfigError::invalid(
                key("stock"),
                "missing: give `stock`, or `variants` with a stock each",
            ))
        }
    };
    Ok((stock, variants))
}

/// `activities[].variants`, validated: ids unique and safe, at least one, each stock exact.
fn variants(
    a: &file::ActivitySection,
    key: &dyn Fn(&str) -> String,
) -> Result<Vec<Variant>, ConfigError> {
    let Some(raw) = &a.variants else {
        return Ok(Vec::new());
    };
    if raw.is_empty() {
        return Err(ConfigError::invalid(
            key("variants"),
            "is empty: list at least one variant, or give `stock`",
        ));
    }
    if raw.len() > MAX_VARIANTS {
        return Err(ConfigError::invalid(
            key("variants"),
            format!("{} variants: at most {MAX_VARIANTS}", raw.len()),
        ));
    }
    let mut out: Vec<Variant> = Vec::with_capacity(raw.len());
    for v in raw {
        let vkey = |field: &str| key(&format!("variants[id={}].{field}", v.id));
        if !super::naming::variant_id(&v.id) {
            return Err(ConfigError::invalid(
                key("variants[].id"),
                format!(
                    "{:?} must be 1 to {MAX_ACTIVITY_ID_LEN} letters, digits, '-', '_', or '.' \
                     between them (40.5)",
                    v.id
                ),
            ));
        }
        if out.iter().any(|o| *o.id == *v.id) {
            return Err(ConfigError::invalid(
                vkey("id"),
                format!("{:?} is configured twice", v.id),
            ));
        }
        if v.stock > MAX_EXACT_INTEGER {
            return Err(ConfigError::invalid(
                vkey("stock"),
                format!("must be at most {MAX_EXACT_INTEGER} (2^53 - 1, kept exact everywhere)"),
            ));
        }
        if let Some(title) = &v.title {
            super::pages::name(&vkey("title"), title)?;
        }
        out.push(Variant {
            id: Arc::from(v.id.as_str()),
            stock: v.stock,
            title: v.title.clone(),
        });
    }
    Ok(out)
}

/// An activity with variants can only be bought on a route that names the variant.
pub(super) fn reachable(activities: &Activities, routes: &[SaleRoute]) -> Result<(), ConfigError> {
    if routes.iter().any(SaleRoute::names_variants) {
        return Ok(());
    }
    match activities.iter().find(|a| a.has_variants()) {
        Some(a) => Err(ConfigError::invalid(
            super::naming::activity_key(&a.id, "variants"),
            "no sale route names a variant: give a route `variant_query`, or `{variant}` in its path",
        )),
        None => Ok(()),
    }
}
