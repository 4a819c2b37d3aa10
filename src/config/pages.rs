//! `pages:` and each activity's `title` and `success_url`: what the buyer's pages show, and
//! templates that replace the built-in ones (read and parsed here, so `flashgate check` and a
//! reload refuse a template that does not parse, and the running configuration stays).

use super::ConfigError;
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `pages:` as written.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PagesSection {
    /// A directory whose `waiting.html` and `refusal.html` (either or both) replace the
    /// built-in templates; relative to the configuration file. Read at start and on each reload.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// The shop's name, shown on every page.
    #[serde(default)]
    pub shop_name: Option<String>,
    /// Where a page's "back to the shop" link goes (a path or an http(s) URL); default `/`.
    #[serde(default)]
    pub shop_url: Option<String>,
    /// Origins (`https://shop.example`) that may show the buyer's pages in a frame
    /// (`Content-Security-Policy: frame-ancestors`); none by default (`'none'`).
    #[serde(default)]
    pub frame_ancestors: Vec<String>,
}

/// The templates a page may be replaced by.
pub const TEMPLATE_NAMES: [&str; 2] = ["waiting.html", "refusal.html"];

/// `pages:` and the activities' page keys, validated.
#[derive(Debug, Clone, Default)]
pub struct PagesSettings {
    /// Empty when not configured.
    pub shop_name: String,
    pub shop_url: String,
    /// Origins that may frame the pages (`scheme://host[:port]`); empty: none.
    pub frame_ancestors: Vec<String>,
    /// Templates from `pages.dir` by name ([`TEMPLATE_NAMES`]), each parsed once already; a
    /// name not here uses the built-in one.
    pub templates: HashMap<&'static str, String>,
    /// Each activity's title and success URL, by id (activities with neither are absent).
    pub activities: HashMap<Arc<str>, ActivityPage>,
}

/// An activity's `title` and `success_url`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActivityPage {
    /// Shown on the waiting and refusal pages.
    pub title: Option<String>,
    /// Where a browser buyer whose purchase from the waiting page won is sent (303), `{jti}`
    /// replaced by the reservation id.
    pub success_url: Option<String>,
}

impl PagesSettings {
    /// The page keys of activity `id` (none set: both `None`).
    pub fn activity(&self, id: &str) -> &ActivityPage {
        static NONE: ActivityPage = ActivityPage {
            title: None,
            success_url: None,
        };
        self.activities.get(id).unwrap_or(&NONE)
    }
}

/// Longest `shop_name` or `title`, in characters.
const MAX_NAME_CHARS: usize = 200;
/// Longest URL (`shop_url`, `success_url`), in bytes.
const MAX_URL_BYTES: usize = 2048;

/// An activity's page keys as written (`activities[i]`).
pub struct Written<'a> {
    pub id: &'a str,
    pub title: Option<&'a String>,
    pub success_url: Option<&'a String>,
}

/// Validates `pages:` (templates read from `base_dir`-relative `dir`) and the activities'
/// `title` and `success_url`.
pub fn pages(
    raw: Option<PagesSection>,
    activities: &[Written<'_>],
    base_dir: &Path,
) -> Result<PagesSettings, ConfigError> {
    let raw = raw.unwrap_or_default();
    let shop_name = raw.shop_name.unwrap_or_default();
    name("pages.shop_name", &shop_name)?;
    let shop_url = raw.shop_url.unwrap_or_else(|| "/".to_owned());
    url("pages.shop_url", &shop_url)?;
    let templates = match raw.dir {
        Some(dir) => templates(&base_dir.join(dir))?,
        None => HashMap::new(),
    };
    let frame_ancestors = (raw.frame_ancestors.iter().enumerate())
        .map(|(i, o)| origin(&format!("pages.frame_ancestors[{i}]"), o))
        .collect::<Result<Vec<_>, _>>()?;
    let mut pages = HashMap::new();
    for (i, a) in activities.iter().enumerate() {
        // Named by id, as every activity's error is (by index while the id is unreadable).
        let key = |field: &str| super::naming::field_key(i, a.id, field);
        if let Some(title) = a.title {
            name(&key("title"), title)?;
        }
        if let Some(success) = a.success_url {
            url(&key("success_url"), success)?;
        }
        if a.title.is_some() || a.success_url.is_some() {
            let page = ActivityPage {
                title: a.title.cloned(),
                success_url: a.success_url.cloned(),
            };
            pages.insert(Arc::from(a.id), page);
        }
    }
    Ok(PagesSettings {
        shop_name,
        shop_url,
        frame_ancestors,
        templates,
        activities: pages,
    })
}

/// An origin as a CSP source: `http(s)://host[:port]`, nothing after it.
fn origin(key: &str, value: &str) -> Result<String, ConfigError> {
    let bad = || {
        ConfigError::invalid(
            key,
            format!("{value:?} is not an origin like https://shop.example (scheme, host, port)"),
        )
    };
    let rest = (value.strip_prefix("https://"))
        .or_else(|| value.strip_prefix("http://"))
        .ok_or_else(bad)?;
    let host_ok = |c: char| c.is_ascii_alphanumeric() || "-.:[]".contains(c);
    if rest.is_empty() || !rest.chars().all(host_ok) {
        return Err(bad());
    }
    Ok(value.to_ascii_lowercase())
}

/// The templates in `dir`, each parsed (minijinja) to refuse one that cannot be.
fn templates(dir: &Path) -> Result<HashMap<&'static str, String>, ConfigError> {
    if !dir.is_dir() {
        return Err(ConfigError::invalid(
            "pages.dir",
            format!("{} is not a directory", dir.display()),
        ));
    }
    let mut out = HashMap::new();
    for name in TEMPLATE_NAMES {
        let path = dir.join(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(ConfigError::invalid(
                    "pages.dir",
                    format!("cannot read {}: {e}", path.display()),
                ))
            }
        };
        let env = minijinja::Environment::new();
        if let Err(e) = env.template_from_named_str(name, &text) {
            // minijinja's message names the line (`... (in waiting.html:3)`).
            return Err(ConfigError::invalid(
                "pages.dir",
                format!("{}: {e}", path.display()),
            ));
        }
        out.insert(name, text);
    }
    if out.is_empty() {
        return Err(ConfigError::invalid(
            "pages.dir",
            format!(
                "{} holds neither {}",
                dir.display(),
                TEMPLATE_NAMES.join(" nor ")
            ),
        ));
    }
    Ok(out)
}

/// A name shown on a page: at most [`MAX_NAME_CHARS`], no control characters.
/// A name shown on a page (`shop_name`, an activity's or a variant's `title`): at most
/// [`MAX_NAME_CHARS`] characters, none a control character.
pub(super) fn name(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.chars().count() > MAX_NAME_CHARS || value.chars().any(char::is_control) {
        return Err(ConfigError::invalid(
            key,
            format!("must be at most {MAX_NAME_CHARS} characters, none a control character"),
        ));
    }
    Ok(())
}

/// A link a page or a redirect sends the buyer to: a path on this site (`/…`, not `//…`, nor
/// `/\…`, which browsers read as `//…`, another host) or an `http(s)://` URL, without spaces,
/// backslashes or control characters.
pub(super) fn url(key: &str, value: &str) -> Result<(), ConfigError> {
    let site_path = value.starts_with('/') && !value.starts_with("//");
    let absolute = ["http://", "https://"]
        .iter()
        .any(|s| value.len() > s.len() && value[..s.len()].eq_ignore_ascii_case(s));
    let clean = !value.is_empty()
        && value.len() <= MAX_URL_BYTES
        && value.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
    if !(clean && (site_path || absolute)) {
        return Err(ConfigError::invalid(
            key,
            format!("{value:?} must be a path (/…) or an http(s) URL, visible ASCII without a backslash, at most {MAX_URL_BYTES} bytes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_paths_or_http_urls() {
        for good in ["/", "/orders/{jti}", "https://shop.example/o?id={jti}"] {
            assert!(url("k", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "//evil.example/",
            "javascript:alert(1)",
            "orders",
            "/a b",
            "https://",
            "/\u{7f}",
            "/\\evil.example/{jti}",
            "/\\/evil.example/",
            "https://evil.example\\@shop.example/",
        ] {
            assert!(url("k", bad).is_err(), "{bad:?}");
        }
    }
}
