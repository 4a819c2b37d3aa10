//! The headers flashgate reads or writes, and what reaches the backend on every route:
//!
//! - nothing that reads as the reservation or passthrough header (case, and `_` for `-`: CGI-style
//!   servers map `X_Flashgate_Reservation` onto the same variable as the real header) unless the
//!   gateway set it;
//! - the identity header only from a trusted peer when `identity.trusted_proxies` is set, and no
//!   look-alike of it ever;
//! - `X-Forwarded-For`, `Forwarded` and `X-Real-IP` written as a proxy should: the real peer
//!   appended to what a trusted proxy sent, and what an untrusted peer claimed dropped;
//! - from an untrusted peer, none of the other headers that claim a client address, host,
//!   scheme, URL or method ([`CLIENT_CLAIMS`]), under any spelling;
//! - one `Content-Length` (a repeated identical value normalised; differing ones are refused
//!   before anything else, as smuggling attempts).

use http::HeaderName;
use pingora::http::{RequestHeader, ResponseHeader};
use std::net::IpAddr;

pub use crate::header_names::*;

/// Hop-by-hop headers: meant for one connection, never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Headers a proxy never forwards upstream: the hop-by-hop ones, and those the buyer's
/// `Connection` header nominates (except the ones a client may not remove that way).
pub fn strip_hop_by_hop(req: &mut RequestHeader) {
    let nominated: Vec<String> = req
        .headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .filter(|t| {
            !matches!(
                t.as_str(),
                "host" | "x-forwarded-for" | "x-forwarded-host" | "x-forwarded-proto"
            )
        })
        .take(16)
        .collect();
    for name in nominated.iter().map(String::as_str).chain(HOP_BY_HOP) {
        req.remove_header(name);
    }
}

/// The backend's hop-by-hop headers, removed before its answer is relayed (the buyer's
/// connection frames the body itself).
pub fn strip_response_hop_by_hop(resp: &mut ResponseHeader) {
    for name in ["connection", "keep-alive", "proxy-connection", "upgrade"] {
        resp.remove_header(name);
    }
}

/// A header name as CGI-style servers read it: case does not matter, and every character but
/// a letter or a digit reads as `-` (CGI maps `-` to `_`; lighttpd maps every other one too).
fn reads_as(name: &str, other: &str) -> bool {
    name.len() == other.len()
        && name
            .bytes()
            .zip(other.bytes())
            .all(|(a, b)| norm(a) == norm(b))
}

fn norm(b: u8) -> u8 {
    match b {
        b if b.is_ascii_alphanumeric() => b.to_ascii_lowercase(),
        _ => b'-',
    }
}

/// Removes every header that reads as `name` (the exact one too).
pub fn remove_lookalikes(req: &mut RequestHeader, name: &str) {
    let doomed: Vec<HeaderName> = req
        .headers
        .keys()
        .filter(|k| reads_as(k.as_str(), name))
        .cloned()
        .collect();
    for k in doomed {
        req.remove_header(&k);
    }
}

/// Removes the look-alikes of `name` but keeps the exact header.
pub fn remove_other_spellings(req: &mut RequestHeader, name: &str) {
    let doomed: Vec<HeaderName> = req
        .headers
        .keys()
        .filter(|k| k.as_str() != name && reads_as(k.as_str(), name))
        .cloned()
        .collect();
    for k in doomed {
        req.remove_header(&k);
    }
}

/// Whether header `name` reads as `pattern` (a name, or a prefix with a trailing `*`).
fn reads_as_pattern(name: &str, pattern: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.len() >= prefix.len() && reads_as(&name[..prefix.len()], prefix),
        None => reads_as(name, pattern),
    }
}

/// From a peer that is not a trusted proxy: removes every header that claims an address, a host,
/// a scheme, a URL or a method ([`CLIENT_CLAIMS`]), or an identity an auth proxy vouched for
/// ([`IDENTITY_CLAIMS`] and `extra`, `identity.strip_headers`), under any spelling, but
/// `identity` (the configured identity header, which has its own rule).
pub fn remove_client_claims(req: &mut RequestHeader, identity: Option<&str>, extra: &[String]) {
    // One pass over the request's headers (not one per claim).
    let claims = |k: &HeaderName| {
        let k = k.as_str();
        if identity.is_some_and(|id| reads_as(k, id)) {
            return false;
        }
        CLIENT_CLAIMS.iter().any(|name| reads_as(k, name))
            || IDENTITY_CLAIMS.iter().any(|p| reads_as_pattern(k, p))
            || extra.iter().any(|p| reads_as_pattern(k, p))
    };
    let doomed: Vec<HeaderName> = req.headers.keys().filter(|k| claims(k)).cloned().collect();
    for k in doomed {
        req.remove_header(&k);
    }
}

/// The address as `Forwarded: for=` writes it (IPv6 quoted and bracketed, RFC 7239).
fn forwarded_for(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("for={v4}"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
    }
}

/// Rewrites the forwarding headers: from a trusted proxy, the peer is appended to its chain;
/// from anyone else, the chain starts at the peer. `X-Real-IP` becomes the client address
/// flashgate itself uses.
pub fn write_forwarding(
    req: &mut RequestHeader,
    peer: Option<IpAddr>,
    peer_trusted: bool,
    client: Option<IpAddr>,
) -> pingora::Result<()> {
    let joined = |req: &RequestHeader, name: &str| -> Option<String> {
        let values: Vec<&str> = req
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        (!values.is_empty()).then(|| values.join(", "))
    };
    let (xff, forwarded) = if peer_trusted {
        (joined(req, X_FORWARDED_FOR), joined(req, FORWARDED))
    } else {
        (None, None)
    };
    for name in [X_FORWARDED_FOR, FORWARDED, X_REAL_IP] {
        remove_lookalikes(req, name);
    }
    let Some(peer) = peer else {
        return Ok(());
    };
    let chain = |before: Option<String>, hop: String| match before {
        Some(b) if !b.is_empty() => format!("{b}, {hop}"),
        _ => hop,
    };
    req.insert_header(X_FORWARDED_FOR, chain(xff, peer.to_string()))?;
    req.insert_header(FORWARDED, chain(forwarded, forwarded_for(peer)))?;
    req.insert_header(X_REAL_IP, client.unwrap_or(peer).to_string())?;
    Ok(())
}

/// `Content-Length` values that disagree, or one that is not a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("conflicting or malformed Content-Length")]
pub struct ConflictingLength;

/// The request's `Content-Length` values (every header, every comma-separated item): `Err` when
/// they disagree (or one is not a number), else the one value if any.
pub fn content_length(req: &RequestHeader) -> Result<Option<u64>, ConflictingLength> {
    let mut found: Option<u64> = None;
    for value in req.headers.get_all(http::header::CONTENT_LENGTH) {
        let text = value.to_str().map_err(|_| ConflictingLength)?;
        for item in text.split(',') {
            let n: u64 = item.trim().parse().map_err(|_| ConflictingLength)?;
            match found {
                Some(f) if f != n => return Err(ConflictingLength),
                _ => found = Some(n),
            }
        }
    }
    Ok(found)
}

/// Writes a single `Content-Length` where the request had the same value repeated.
pub fn normalise_content_length(req: &mut RequestHeader) -> pingora::Result<()> {
    let repeated = req
        .headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .count()
        > 1
        || req
            .headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes().contains(&b','));
    if repeated {
        if let Ok(Some(n)) = content_length(req) {
            req.insert_header(http::header::CONTENT_LENGTH, n.to_string())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("POST", b"/", None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn lookalikes_of_a_header_are_all_removed() {
        let mut r = req(&[
            ("X-Flashgate-Reservation", "forged"),
            ("X_Flashgate_Reservation", "forged"),
            ("x_FLASHGATE-reservation", "forged"),
            ("X-Flashgate-Reservations", "kept"),
        ]);
        remove_lookalikes(&mut r, "x-flashgate-reservation");
        let left: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-flashgate-reservations"]);
        let mut r = req(&[("X-User-Id", "alice"), ("X_User_Id", "mallory")]);
        remove_other_spellings(&mut r, "x-user-id");
        assert_eq!(r.headers.get("x-user-id").unwrap(), "alice");
        assert_eq!(r.headers.len(), 1);
    }

    #[test]
    fn forwarding_headers_chain_only_from_trusted_peers() {
        let peer: IpAddr = "10.0.0.5".parse().unwrap();
        let client: IpAddr = "203.0.113.9".parse().unwrap();
        let claims = [
            ("X-Forwarded-For", "203.0.113.9"),
            ("Forwarded", "for=203.0.113.9"),
            ("X-Real-IP", "1.2.3.4"),
        ];
        let mut trusted = req(&claims);
        write_forwarding(&mut trusted, Some(peer), true, Some(client)).unwrap();
        assert_eq!(
            trusted.headers.get(X_FORWARDED_FOR).unwrap(),
            "203.0.113.9, 10.0.0.5"
        );
        assert_eq!(
            trusted.headers.get(FORWARDED).unwrap(),
            "for=203.0.113.9, for=10.0.0.5"
        );
        assert_eq!(trusted.headers.get(X_REAL_IP).unwrap(), "203.0.113.9");
        let mut untrusted = req(&claims);
        write_forwarding(&mut untrusted, Some(peer), false, Some(peer)).unwrap();
        assert_eq!(untrusted.headers.get(X_FORWARDED_FOR).unwrap(), "10.0.0.5");
        assert_eq!(untrusted.headers.get(FORWARDED).unwrap(), "for=10.0.0.5");
        assert_eq!(untrusted.headers.get(X_REAL_IP).unwrap(), "10.0.0.5");
        let claims = [
            ("True-Client-IP", "1.2.3.4"),
            ("X_Client_IP", "1.2.3.4"),
            ("X-Forwarded-Host", "evil"),
            ("X-Forwarded-Proto", "https"),
            ("X-Original-URL", "/api/seckill/1/buy"),
            ("X-HTTP-Method-Override", "POST"),
        ];
        let mut untrusted = req(&claims);
        remove_client_claims(&mut untrusted, None, &[]);
        assert!(untrusted.headers.is_empty());
        let mut keeps_identity = req(&[("X-Forwarded-User", "alice"), ("X-Client-IP", "1")]);
        remove_client_claims(&mut keeps_identity, Some("x-forwarded-user"), &[]);
        let left: Vec<&str> = keeps_identity.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            left,
            ["x-forwarded-user"],
            "the identity header has its own rule"
        );
        let mut v6 = req(&[]);
        write_forwarding(&mut v6, Some("::1".parse().unwrap()), false, None).unwrap();
        assert_eq!(v6.headers.get(FORWARDED).unwrap(), "for=\"[::1]\"");
    }

    #[test]
    fn content_lengths_agree_or_are_refused() {
        assert_eq!(content_length(&req(&[])), Ok(None));
        assert_eq!(
            content_length(&req(&[("Content-Length", "3")])),
            Ok(Some(3))
        );
        let mut repeated = req(&[("Content-Length", "3, 3")]);
        assert_eq!(content_length(&repeated), Ok(Some(3)));
        normalise_content_length(&mut repeated).unwrap();
        assert_eq!(repeated.headers.get("content-length").unwrap(), "3");
        let mut twice = req(&[("Content-Length", "3"), ("Content-Length", "3")]);
        normalise_content_length(&mut twice).unwrap();
        assert_eq!(twice.headers.get_all("content-length").iter().count(), 1);
        assert!(content_length(&req(&[("Content-Length", "3, 4")])).is_err());
        assert!(content_length(&req(&[("Content-Length", "3"), ("Content-Length", "5")])).is_err());
        assert!(content_length(&req(&[("Content-Length", "x")])).is_err());
    }
}
