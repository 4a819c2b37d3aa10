//! Who the buyer is, and from which address they come.
//!
//! Two sources of identity:
//! - a header set by an auth layer in front. With `trusted_proxies`, the header counts only when
//!   the TCP peer is one of those proxies: anyone else could type any user id into it;
//! - a bearer token (an `Authorization: Bearer` header, or a named cookie), verified by
//!   [`super::token`].

pub use super::token::{claim_values, Buyer, Claims, Unidentified, MAX_USER_ID_LEN};
use super::token::{user_id, JwtVerifier};
use crate::config::{IdentitySettings, IdentitySource};
use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use std::net::IpAddr;

pub struct Identifier {
    source: Source,
    trusted_proxies: Vec<IpNet>,
}

enum Source {
    Header(HeaderName),
    Jwt(JwtVerifier),
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

    /// The buyer (their user id, and a verified token's claims), or why there is none.
    pub fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Buyer, Unidentified> {
        match &self.source {
            Source::Header(name) => {
                if !self.trusted_proxies.is_empty() && !self.trusts(peer) {
                    return Err(Unidentified::Missing);
                }
                let value = single(headers, name).and_then(|v| v.to_str().ok());
                value
                    .and_then(user_id)
                    .map(|user| Buyer::named(user.to_owned()))
                    .ok_or(Unidentified::Missing)
            }
            Source::Jwt(verifier) => verifier.identify(headers),
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

/// Exactly one value of a header (two identities are none).
fn single<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h http::HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values.next().is_none().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::JwtIdentitySettings;
    use jsonwebtoken::DecodingKey;

    impl Identifier {
        /// The buyer, or `None` whatever the reason.
        fn identify_ok(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<String> {
            self.identify(headers, peer).ok().map(|b| b.user)
        }
    }
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
            phase_headers: vec![],
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
            phase_headers: vec![],
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
            open.identify_ok(&headers(&[("x-user-id", " bob ")]), lo)
                .as_deref(),
            Some("bob")
        );
        assert_eq!(open.identify_ok(&headers(&[]), lo), None);
        assert_eq!(
            open.identify_ok(&headers(&[("x-user-id", "a"), ("x-user-id", "b")]), lo),
            None
        );
        assert_eq!(
            open.identify_ok(&headers(&[("x-user-id", &"a".repeat(129))]), lo),
            None
        );

        let guarded = header_identifier(&["10.0.0.0/8"]);
        let h = headers(&[("x-user-id", "alice")]);
        assert_eq!(
            guarded.identify_ok(&h, lo),
            None,
            "spoofed: the peer is not a trusted proxy"
        );
        assert_eq!(guarded.identify_ok(&h, None), None);
        assert_eq!(
            guarded
                .identify_ok(&h, Some("10.1.2.3".parse().unwrap()))
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
        assert_eq!(
            id.identify_ok(&bearer(&token), None).as_deref(),
            Some("alice")
        );
        let cookie = headers(&[("cookie", &format!("theme=dark; session={token}"))]);
        assert_eq!(id.identify_ok(&cookie, None).as_deref(), Some("alice"));
        let rsa = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/rsa.pem"
        ))
        .unwrap();
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("b".into());
        let rs =
            jsonwebtoken::encode(&h, &claims(), &EncodingKey::from_rsa_pem(&rsa).unwrap()).unwrap();
        assert_eq!(id.identify_ok(&bearer(&rs), None).as_deref(), Some("alice"));
    }

    #[test]
    fn claim_values_read_strings_numbers_booleans_and_arrays() {
        let claims: Claims = serde_json::from_value(
            json!({"a": "gold", "b": 1, "c": [true, "x", {"no": 1}], "d": null}),
        )
        .unwrap();
        let v =
            |n: &str| -> Vec<String> { claim_values(&claims, n).map(|c| c.into_owned()).collect() };
        assert_eq!(v("a"), ["gold"]);
        assert_eq!(v("b"), ["1"]);
        assert_eq!(v("c"), ["true", "x"]);
        assert!(v("d").is_empty() && v("zz").is_empty());
    }

    #[test]
    fn a_request_names_one_buyer_or_is_refused() {
        let id = jwt_identifier();
        let alice = hs256(Some("a"), &claims());
        let mut bob_claims = claims();
        bob_claims["sub"] = json!("bob");
        let bob = hs256(Some("a"), &bob_claims);
        let ask = |pairs: &[(&str, &str)]| id.identify(&headers(pairs), None).map(|b| b.user);
        let (a, b) = (format!("Bearer {alice}"), format!("Bearer {bob}"));
        let (cookie_a, cookie_b) = (format!("session={alice}"), format!("session={bob}"));
        // Two bearer headers, even the same twice: which one a backend reads is its own choice.
        let two = [("authorization", a.as_str()), ("authorization", b.as_str())];
        assert_eq!(ask(&two), Err(Unidentified::Ambiguous));
        let same = [("authorization", a.as_str()), ("authorization", a.as_str())];
        assert_eq!(ask(&same), Err(Unidentified::Ambiguous));
        // A bearer and another buyer's session cookie; the same buyer's is fine.
        let mixed = [("authorization", a.as_str()), ("cookie", cookie_b.as_str())];
        assert_eq!(ask(&mixed), Err(Unidentified::Ambiguous));
        let agreeing = [("authorization", a.as_str()), ("cookie", cookie_a.as_str())];
        assert_eq!(ask(&agreeing).as_deref(), Ok("alice"));
        // A stale cookie beside a valid bearer names nobody else.
        let stale = [("authorization", a.as_str()), ("cookie", "session=junk")];
        assert_eq!(ask(&stale).as_deref(), Ok("alice"));
        // The session cookie twice with different values, in one header or two.
        let one_header = format!("session={alice}; theme=dark; session={bob}");
        assert_eq!(
            ask(&[("cookie", &one_header)]),
            Err(Unidentified::Ambiguous)
        );
        let two_headers = [("cookie", cookie_a.as_str()), ("cookie", cookie_b.as_str())];
        assert_eq!(ask(&two_headers), Err(Unidentified::Ambiguous));
        let repeated = [("cookie", cookie_a.as_str()), ("cookie", cookie_a.as_str())];
        assert_eq!(
            ask(&repeated).as_deref(),
            Ok("alice"),
            "the same cookie twice"
        );
        // Spellings other frameworks read as the session cookie.
        for other in ["session =", "Session=", "%73ession=", "session\t="] {
            let both = format!("{other}{bob}; session={alice}");
            assert_eq!(
                ask(&[("cookie", &both)]),
                Err(Unidentified::Ambiguous),
                "{other}"
            );
            let beside = format!("{other}{bob}");
            let mixed = [("authorization", a.as_str()), ("cookie", beside.as_str())];
            assert_eq!(
                ask(&mixed),
                Err(Unidentified::Ambiguous),
                "bearer + {other}"
            );
        }
        // The second adversarial pass: another buyer's cookie quoted, percent-encoded, after a
        // comma, or in a header with a byte that is not ASCII.
        let quoted = format!("session=\"{bob}\"");
        let encoded_value = format!("session={}", bob.replace('.', "%2E"));
        let comma = format!("x=1, session={bob}");
        for cookie in [&quoted, &encoded_value, &comma] {
            let mixed = [("authorization", a.as_str()), ("cookie", cookie.as_str())];
            assert_eq!(ask(&mixed), Err(Unidentified::Ambiguous), "{cookie}");
        }
        let mut non_ascii = headers(&[("authorization", &a)]);
        let mut bytes = b"x=\xe9; session=".to_vec();
        bytes.extend_from_slice(bob.as_bytes());
        non_ascii.append(
            http::header::COOKIE,
            http::HeaderValue::from_bytes(&bytes).unwrap(),
        );
        assert_eq!(
            id.identify(&non_ascii, None).map(|b| b.user),
            Err(Unidentified::Ambiguous)
        );
        assert_eq!(ask(&[]), Err(Unidentified::Missing));
        assert_eq!(
            Unidentified::Ambiguous.decision().reply().code,
            "bad_request"
        );
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
            assert_eq!(id.identify_ok(&bearer(&token), None), None, "{what}");
        }
        assert_eq!(id.identify_ok(&headers(&[]), None), None, "no token");
        assert_eq!(
            id.identify_ok(&headers(&[("authorization", "Basic YWxpY2U6eA==")]), None),
            None
        );
    }
}
