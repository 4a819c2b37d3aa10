//! `server.cors`: which other origins (a shop's app on another host) may call the sale routes
//! and the waiting room from a browser, and the one way an origin is normalised, for the
//! configuration and for each request alike.

use super::ConfigError;
use schemars::JsonSchema;
use serde::Deserialize;

/// `server.cors` as written.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CorsSection {
    /// Origins (`scheme://host[:port]`, no path) whose pages may call the sale routes and
    /// `/flashgate/queue/*` with credentials and read `X-Flashgate-Ticket`. Matched exactly
    /// once normalised (scheme and host lower-cased, a default port dropped, an international
    /// host in its ASCII form).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

/// `server.cors`, validated: the allowed origins, normalised. Empty: no other origin is
/// allowed (preflights are still answered by the gateway, without allow headers).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CorsSettings {
    pub allowed_origins: Vec<String>,
}

impl CorsSettings {
    /// The normalised origin if `origin` (an `Origin` header's value) is listed; `None` when it
    /// is not, or cannot be read (fail closed).
    pub fn allowed(&self, origin: &str) -> Option<String> {
        let origin = normalise_origin(origin)?;
        self.allowed_origins.contains(&origin).then_some(origin)
    }
}

/// An origin in its one spelling (`https://shop.example`, `http://127.0.0.1:8080`), or `None`
/// when it is not a plain http(s) origin: a path, a query, a fragment, user info, `null`, any
/// other scheme, whitespace or a character outside visible ASCII is refused, never guessed at.
pub fn normalise_origin(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.split_once("://")?;
    if rest.is_empty()
        || rest.contains(['/', '?', '#', '@', '\\'])
        || !origin.bytes().all(|b| b.is_ascii_graphic())
        || !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
    {
        return None;
    }
    let parsed = url::Url::parse(origin).ok()?;
    match parsed.origin() {
        url::Origin::Tuple(..) => Some(parsed.origin().ascii_serialization()),
        url::Origin::Opaque(_) => None,
    }
}

/// Validates `server.cors`.
pub fn cors(raw: Option<CorsSection>) -> Result<CorsSettings, ConfigError> {
    let raw = raw.unwrap_or_default();
    let mut allowed_origins = Vec::with_capacity(raw.allowed_origins.len());
    for (i, origin) in raw.allowed_origins.iter().enumerate() {
        // The configuration may spell an international host in Unicode; a browser sends it in
        // its ASCII form, which is what is kept.
        let ascii = url::Url::parse(origin)
            .ok()
            .filter(|u| u.path() == "/" && !origin.trim_end().ends_with('/'))
            .map(|u| u.origin().ascii_serialization());
        let normalised = ascii.as_deref().and_then(normalise_origin).ok_or_else(|| {
            ConfigError::invalid(
                format!("server.cors.allowed_origins[{i}]"),
                format!(
                    "{origin:?} is not an origin: scheme://host[:port] with http or https, no path"
                ),
            )
        })?;
        if !allowed_origins.contains(&normalised) {
            allowed_origins.push(normalised);
        }
    }
    Ok(CorsSettings { allowed_origins })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_normalised_and_odd_ones_refused() {
        for (raw, want) in [
            ("https://shop.example", Some("https://shop.example")),
            ("HTTPS://Shop.EXAMPLE", Some("https://shop.example")),
            ("https://shop.example:443", Some("https://shop.example")),
            ("http://shop.example:80", Some("http://shop.example")),
            (
                "https://shop.example:8443",
                Some("https://shop.example:8443"),
            ),
            ("http://127.0.0.1:9000", Some("http://127.0.0.1:9000")),
            (
                "https://xn--bcher-kva.example",
                Some("https://xn--bcher-kva.example"),
            ),
            ("https://shop.example/", None),
            ("https://shop.example/x", None),
            ("https://shop.example?x", None),
            ("https://u@shop.example", None),
            ("https://shop.example ", None),
            ("null", None),
            ("file://x", None),
            ("ftp://shop.example", None),
            ("https://", None),
            ("https://shop.example:99999", None),
            ("shop.example", None),
            ("https://bücher.example", None),
        ] {
            assert_eq!(normalise_origin(raw).as_deref(), want, "{raw}");
        }
    }

    #[test]
    fn the_configuration_may_spell_a_host_in_unicode() {
        let settings = cors(Some(CorsSection {
            allowed_origins: vec!["https://bücher.example".into(), "https://A.example".into()],
        }))
        .unwrap();
        assert_eq!(
            settings.allowed_origins,
            ["https://xn--bcher-kva.example", "https://a.example"]
        );
        assert_eq!(
            settings.allowed("https://a.example:443").as_deref(),
            Some("https://a.example")
        );
        assert_eq!(settings.allowed("https://b.example"), None);
        assert_eq!(settings.allowed("https://a.example/"), None);
    }
}
