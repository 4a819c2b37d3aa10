//! The `identity:` section: who the buyer is (a header from trusted proxies, or a verified
//! token), the identity headers stripped from untrusted peers, and the opt-out for a header
//! anyone can set.

use super::file;
use super::keys::jwt_identity;
use super::settings::{IdentitySettings, IdentitySource};
use super::{header_name, ConfigError, SecretSource};
use ipnet::IpNet;
use std::net::IpAddr;
use std::path::Path;

/// A header name, or a prefix of names with a trailing `*`, in lower case.
fn header_pattern(key: &str, pattern: &str) -> Result<String, ConfigError> {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(ConfigError::invalid(
            key,
            format!("{pattern:?} is not a header name (a trailing * matches a prefix)"),
        ));
    }
    Ok(pattern.to_ascii_lowercase())
}

pub(super) fn identity(
    raw: file::IdentitySection,
    base_dir: &Path,
    secrets: &dyn SecretSource,
) -> Result<IdentitySettings, ConfigError> {
    let trusted_proxies = raw
        .trusted_proxies
        .iter()
        .enumerate()
        .map(|(i, cidr)| {
            cidr.parse::<IpNet>()
                .or_else(|_| cidr.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    ConfigError::invalid(
                        format!("identity.trusted_proxies[{i}]"),
                        format!("{cidr:?} is not a CIDR like 10.0.0.0/8 or an IP address"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let strip_headers = raw
        .strip_headers
        .iter()
        .enumerate()
        .map(|(i, pattern)| header_pattern(&format!("identity.strip_headers[{i}]"), pattern))
        .collect::<Result<Vec<_>, _>>()?;
    let source = match (raw.header, raw.jwt) {
        (Some(header), None) => IdentitySource::Header(header_name("identity.header", &header)?),
        (None, Some(jwt)) => IdentitySource::Jwt(jwt_identity(jwt, base_dir, secrets)?),
        (Some(_), Some(_)) => {
            return Err(ConfigError::invalid(
                "identity",
                "set either header or jwt, not both",
            ))
        }
        (None, None) => {
            return Err(ConfigError::invalid(
                "identity",
                "set header (a trusted auth layer in front) or jwt (verify bearer tokens)",
            ))
        }
    };
    Ok(IdentitySettings {
        source,
        trusted_proxies,
        strip_headers,
        header_from_any_peer: raw.header_from_any_peer,
        phase_headers: Vec::new(),
    })
}
