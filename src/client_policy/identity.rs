//! Who the buyer is, and from which address they come.
//!
//! Two sources of identity:
//! - a header set by an auth layer in front. With `trusted_proxies`, the header counts only when
//!   the TCP peer is one of those proxies: anyone else could type any user id into it;
//! - a bearer token (an `Authorization: Bearer` header, or a named cookie) verified here with
//!   the configured keys, by `kid`: the token's `alg` must be its key's algorithm (no algorithm
//!   confusion, and "none" is never accepted), `exp` is required, `nbf`, `iss` and `aud` are
//!   checked where given, and the user id is the configured claim.

use crate::config::{IdentitySettings, IdentitySource, JwtIdentitySettings};
use http::{header, HeaderMap, HeaderName};
use ipnet::IpNet;
use jsonwebtoken::{DecodingKey, Validation};
use std::net::IpAddr;

/// Longest user id accepted, from a header or a token claim.
pub const MAX_USER_ID_LEN: usize = 128;

/// Longest identity token accepted (a guard against giant headers and cookies).
const MAX_TOKEN_LEN: usize = 8 * 1024;

pub struct Identifier {
    source: Source,
    trusted_proxies: Vec<IpNet>,
}

enum Source {
    Header(HeaderName),
    Jwt(JwtVerifier),
}

struct JwtVerifier {
    keys: Vec<(String, DecodingKey, Validation)>,
    claim: String,
    cookie: Option<String>,
}

impl Identifier {
    pub fn new(settings: &IdentitySettings) -> Self {
        let source = match &settings.source {
            IdentitySource::Header(name) => Source::Header(name.clone()),
            IdentitySource::Jwt(jwt) => Source::Jwt(JwtVerifier::new(jwt)),
        };
        Identifier {
            source,
            trusted_proxies: settings.trusted_proxies.clone(),
        }
    }

    /// Whether `peer` is one of `identity.trusted_proxies`.
    pub fn trusts(&self, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|ip| self.trusted_proxies.iter().any(|net| net.contains(&ip)))
    }

    /// The buyer's user id, or `None` (answered `unauthenticated`).
    pub fn identify(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<String> {
        match &self.source {
            Source::Header(name) => {
                if !self.trusted_proxies.is_empty() && !self.trusts(peer) {
                    return None;
                }
                user_id(single(headers, name)?.to_str().ok()?).map(str::to_owned)
            }
            Source::Jwt(verifier) => verifier.verify(headers),
        }
    }

    /// The client's address: the TCP peer, or, when that peer is a trusted proxy, the nearest
    /// untrusted address in `X-Forwarded-For` (proxies append, so read it from the right).
    pub fn client_ip(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
        if !self.trusts(peer) {
            return peer;
        }
        let mut client = peer;
        for value in headers
            .get_all(crate::header_names::X_FORWARDED_FOR)
            .iter()
            .rev()
        {
            let Ok(list) = value.to_str() else {
                return client;
            };
            for hop in list.rsplit(',') {
                let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                    return client;
                };
                client = Some(ip);
                if !self.trusts(Some(ip)) {
                    return client;
                }
            }
        }
        client
    }
}

impl JwtVerifier {
    fn new(settings: &JwtIdentitySettings) -> Self {
        let keys = settings
            .keys
            .iter()
            .map(|k| {
                let mut v = Validation::new(k.algorithm);
                v.leeway = settings.leeway.as_secs();
                v.validate_exp = true;
                v.validate_nbf = true;
                // A claim that is checked must be there: a token without `aud` (or `iss`) is
                // not one for this audience (or from this issuer).
                let mut required = vec!["exp"];
                required.extend(settings.audience.as_ref().map(|_| "aud"));
                required.extend(settings.issuer.as_ref().map(|_| "iss"));
                v.set_required_spec_claims(&required);
                match &settings.audience {
                    Some(aud) => v.set_audience(&[aud]),
                    None => v.validate_aud = false,
                }
                if let Some(iss) = &settings.issuer {
                    v.set_issuer(&[iss]);
                }
                (k.kid.clone(), k.key.clone(), v)
            })
            .collect();
        JwtVerifier {
            keys,
            claim: settings.claim.clone(),
            cookie: settings.cookie.clone(),
        }
    }

    fn token<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        if let Some(auth) = single(headers, &header::AUTHORIZATION) {
            let auth = auth.to_str().ok()?;
            let (scheme, token) = auth.split_once(' ')?;
            return scheme
                .eq_ignore_ascii_case("bearer")
                .then_some(token.trim());
        }
        crate::header_names::cookie(headers, self.cookie.as_deref()?)
    }

    fn verify(&self, headers: &HeaderMap) -> Option<String> {
        let token = self.token(headers)?;
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let header = jsonwebtoken::decode_header(token).ok()?;
        // By kid; a token without one is accepted only when there is a single key.
        let (_, key, validation) = match header.kid.as_deref() {
            Some(kid) => self.keys.iter().find(|(k, _, _)| k == kid)?,
            None if self.keys.len() == 1 => &self.keys[0],
            None => return None,
        };
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token, key, validation,
        )
        .ok()?;
        // A claim is the user id as signed: surrounding whitespace is not trimmed into another
        // user's id (a token for " alice" is not alice's), it is refused.
        let claimed = data.claims.get(&self.claim)?.as_str()?;
        user_id(claimed)
            .filter(|id| id.len() == claimed.len())
            .map(str::to_owned)
    }
}

/// Exactly one value of a header (two identities are none).
fn single<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h http::HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values.next().is_none().then_some(value)
}

/// A user id as the gateway accepts it: non-empty after trimming, at most
/// [`MAX_USER_ID_LEN`] bytes of visible ASCII and spaces.
fn user_id(raw: &str) -> Option<&str> {
    let user = raw.trim();
    let valid = !user.is_empty()
        && user.len() <= MAX_USER_ID_LEN
        && user.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    valid.then_some(user)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IdentityKey;
    use http::HeaderValue;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use serde_json::json;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    const SECRET: &[u8] = b"identity-secret";

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn header_identifier(trusted: &[&str]) -> Identifier {
        Identifier::new(&IdentitySettings {
            source: IdentitySource::Header(HeaderName::from_static("x-user-id")),
            trusted_proxies: trusted.iter().map(|c| c.parse().unwrap()).collect(),
            strip_headers: vec![],
            header_from_any_peer: false,
        })
    }

    fn jwt_identifier() -> Identifier {
        let rsa_pub = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/rsa.pub.pem"
        ))
        .unwrap();
        Identifier::new(&IdentitySettings {
            source: IdentitySource::Jwt(JwtIdentitySettings {
                keys: vec![
                    IdentityKey {
                        kid: "a".into(),
                        algorithm: Algorithm::HS256,
                        key: DecodingKey::from_secret(SECRET).unwrap(),
                    },
                    IdentityKey {
                        kid: "b".into(),
                        algorithm: Algorithm::RS256,
                        key: DecodingKey::from_rsa_pem(&rsa_pub).unwrap(),
                    },
                ],
                claim: "sub".into(),
                cookie: Some("session".into()),
                issuer: Some("https://idp.example".into()),
                audience: Some("shop".into()),
                leeway: Duration::from_secs(0),
            }),
            trusted_proxies: vec![],
            strip_headers: vec![],
            header_from_any_peer: false,
        })
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn claims() -> serde_json::Value {
        json!({"sub": "alice", "iss": "https://idp.example", "aud": "shop", "exp": now() + 600})
    }

    fn hs256(kid: Option<&str>, claims: &serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&h, claims, &EncodingKey::from_secret(SECRET).unwrap()).unwrap()
    }

    fn bearer(token: &str) -> HeaderMap {
        headers(&[("authorization", &format!("Bearer {token}"))])
    }

    #[test]
    fn header_identity_and_trusted_proxies() {
        let open = header_identifier(&[]);
        let lo = Some("127.0.0.1".parse().unwrap());
        assert_eq!(
            open.identify(&headers(&[("x-user-id", " bob ")]), lo)
                .as_deref(),
            Some("bob")
        );
        assert_eq!(open.identify(&headers(&[]), lo), None);
        assert_eq!(
            open.identify(&headers(&[("x-user-id", "a"), ("x-user-id", "b")]), lo),
            None
        );
        assert_eq!(
            open.identify(&headers(&[("x-user-id", &"a".repeat(129))]), lo),
            None
        );

        let guarded = header_identifier(&["10.0.0.0/8"]);
        let h = headers(&[("x-user-id", "alice")]);
        assert_eq!(
            guarded.identify(&h, lo),
            None,
            "spoofed: the peer is not a trusted proxy"
        );
        assert_eq!(guarded.identify(&h, None), None);
        assert_eq!(
            guarded
                .identify(&h, Some("10.1.2.3".parse().unwrap()))
                .as_deref(),
            Some("alice")
        );
    }

    #[test]
    fn client_ip_trusts_forwarded_for_only_from_trusted_proxies() {
        let id = header_identifier(&["10.0.0.0/8"]);
        let xff = headers(&[("x-forwarded-for", "1.2.3.4, 10.0.0.7")]);
        let proxy = Some("10.0.0.1".parse().unwrap());
        assert_eq!(id.client_ip(&xff, proxy), Some("1.2.3.4".parse().unwrap()));
        let stranger = Some("5.6.7.8".parse().unwrap());
        assert_eq!(
            id.client_ip(&xff, stranger),
            stranger,
            "a stranger's X-Forwarded-For is ignored"
        );
        let spoof = headers(&[("x-forwarded-for", "9.9.9.9, 1.2.3.4")]);
        assert_eq!(
            id.client_ip(&spoof, proxy),
            Some("1.2.3.4".parse().unwrap()),
            "nearest untrusted hop"
        );
        let junk = headers(&[("x-forwarded-for", "not-an-ip")]);
        assert_eq!(id.client_ip(&junk, proxy), proxy);
    }

    #[test]
    fn valid_tokens_from_header_or_cookie() {
        let id = jwt_identifier();
        let token = hs256(Some("a"), &claims());
        assert_eq!(id.identify(&bearer(&token), None).as_deref(), Some("alice"));
        let cookie = headers(&[("cookie", &format!("theme=dark; session={token}"))]);
        assert_eq!(id.identify(&cookie, None).as_deref(), Some("alice"));
        let rsa = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/rsa.pem"
        ))
        .unwrap();
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("b".into());
        let rs =
            jsonwebtoken::encode(&h, &claims(), &EncodingKey::from_rsa_pem(&rsa).unwrap()).unwrap();
        assert_eq!(id.identify(&bearer(&rs), None).as_deref(), Some("alice"));
    }

    #[test]
    fn every_token_failure_is_unauthenticated() {
        let id = jwt_identifier();
        let mut c = claims();
        let cases: Vec<(&str, String)> = vec![
            ("expired", {
                c["exp"] = json!(now() - 10);
                hs256(Some("a"), &c)
            }),
            ("not yet valid", {
                let mut c = claims();
                c["nbf"] = json!(now() + 600);
                hs256(Some("a"), &c)
            }),
            ("no exp", {
                let mut c = claims();
                c.as_object_mut().unwrap().remove("exp");
                hs256(Some("a"), &c)
            }),
            ("wrong issuer", {
                let mut c = claims();
                c["iss"] = json!("https://evil.example");
                hs256(Some("a"), &c)
            }),
            ("no issuer", {
                let mut c = claims();
                c.as_object_mut().unwrap().remove("iss");
                hs256(Some("a"), &c)
            }),
            ("no audience", {
                let mut c = claims();
                c.as_object_mut().unwrap().remove("aud");
                hs256(Some("a"), &c)
            }),
            ("wrong audience", {
                let mut c = claims();
                c["aud"] = json!("other");
                hs256(Some("a"), &c)
            }),
            ("no user claim", {
                let mut c = claims();
                c.as_object_mut().unwrap().remove("sub");
                hs256(Some("a"), &c)
            }),
            ("user claim with surrounding space", {
                let mut c = claims();
                c["sub"] = json!(" alice");
                hs256(Some("a"), &c)
            }),
            ("numeric user claim", {
                let mut c = claims();
                c["sub"] = json!(42);
                hs256(Some("a"), &c)
            }),
            ("unknown kid", hs256(Some("zzz"), &claims())),
            ("no kid with several keys", hs256(None, &claims())),
            ("forged signature", {
                let t = hs256(Some("a"), &claims());
                format!("{}xx", &t[..t.len() - 2])
            }),
            ("wrong secret", {
                let mut h = Header::new(Algorithm::HS256);
                h.kid = Some("a".into());
                jsonwebtoken::encode(&h, &claims(), &EncodingKey::from_secret(b"other").unwrap())
                    .unwrap()
            }),
            ("alg none", {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                format!(
                    "{}.{}.",
                    b64.encode(r#"{"alg":"none","typ":"JWT","kid":"a"}"#),
                    b64.encode(claims().to_string())
                )
            }),
            (
                "alg confusion: HS256 signed with the RSA public key under the RSA kid",
                {
                    let public = std::fs::read(concat!(
                        env!("CARGO_MANIFEST_DIR"),
                        "/tests/fixtures/rsa.pub.pem"
                    ))
                    .unwrap();
                    let mut h = Header::new(Algorithm::HS256);
                    h.kid = Some("b".into());
                    jsonwebtoken::encode(&h, &claims(), &EncodingKey::from_secret(&public).unwrap())
                        .unwrap()
                },
            ),
            ("garbage", "not.a.token".to_owned()),
        ];
        for (what, token) in cases {
            assert_eq!(id.identify(&bearer(&token), None), None, "{what}");
        }
        assert_eq!(id.identify(&headers(&[]), None), None, "no token");
        assert_eq!(
            id.identify(&headers(&[("authorization", "Basic YWxpY2U6eA==")]), None),
            None
        );
    }
}
