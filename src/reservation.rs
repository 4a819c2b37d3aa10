//! The reservation a winner carries upstream: a compact JWS (JWT) the backend verifies with any
//! standard JWT library. Claims per the contract: `jti`, `sub`, `act`, `qty`, `ver`, `iat`, `exp`,
//! and `var` (the variant bought) on an activity with variants.

use crate::config::SigningSettings;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Stock taken for one winner, not yet handed to the upstream.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// Globally unique id (UUIDv7 made by the gateway): the JWT's `jti`.
    pub id: String,
    pub user: String,
    pub activity: Arc<str>,
    /// The variant bought, on an activity with variants (the JWT's `var`).
    pub variant: Option<Arc<str>>,
    /// The stock segment (segment) it was taken from (0 when the activity is not segmented).
    pub segment: u32,
    pub qty: u32,
    pub version: u64,
    /// Whether this request made it. An idempotent retry that got an earlier request's
    /// reservation back does not own it: whatever happens to the retry, it never releases it.
    pub owned: bool,
    /// When it was made, and when its hold runs out (Redis's clock, unix ms): the token's `iat`
    /// and the latest its `exp` may be, so a replay signs the same claims and no token outlives
    /// the hold.
    pub created_ms: u64,
    pub deadline_ms: u64,
    /// The record's fence once this request's forward is counted: an early order lookup it asks
    /// for (its forward ended without an answer) names it, and is ignored if another forward or
    /// a hand-out moved the fence since (see `lua/lib.lua`).
    pub fence: u64,
    /// On an activity sold in phases, the phase it was bought in (`public` after them all):
    /// the JWT's `phase`.
    pub phase: Option<Arc<str>>,
}

impl Reservation {
    /// A fresh, globally unique reservation id. Made by the gateway (not Redis) so it stays
    /// unique across Redis restarts and instances, and so an ambiguous reserve can be released
    /// by id.
    pub fn new_id() -> String {
        uuid::Uuid::now_v7().to_string()
    }

    /// A reservation id that says which variant's lane and which segment hold the reservation,
    /// so the admin API finds it from the id alone: `<uuid>~<variant>~<segment>` for a drop's
    /// variant (its segment always named: a variant id may hold dots, `40.5`),
    /// `<uuid>.<segment>` for a segmented activity without variants, a plain UUID otherwise.
    /// `reserve.lua` reads the variant too: a key's retry naming another variant is not its
    /// retry. Ids an older flashgate made, `<uuid>~<variant>[.<segment>]` (variant ids had no
    /// dots then), read as they did.
    pub fn id_in_segment(activity: &crate::config::Activity, segment: u32) -> String {
        let mut id = Self::new_id();
        match &activity.variant {
            Some(v) => {
                id.push('~');
                id.push_str(v);
                id.push('~');
                id.push_str(&segment.to_string());
            }
            None if activity.segments > 1 => {
                id.push('.');
                id.push_str(&segment.to_string());
            }
            None => {}
        }
        id
    }

    /// The variant a reservation id names (`None`: an activity without variants).
    pub fn variant_of(id: &str) -> Option<&str> {
        let (_, rest) = id.split_once('~')?;
        Some(match rest.rsplit_once('~') {
            Some((variant, _)) => variant,
            None => rest.split('.').next().unwrap_or(rest),
        })
    }

    /// The segment a reservation id names (0 for a plain UUID).
    pub fn segment_of(id: &str) -> Option<u32> {
        let named = match id.split_once('~') {
            Some((_, rest)) => rest.rsplit_once('~').map(|(_, s)| s),
            None => None,
        };
        match named.or_else(|| id.rsplit_once('.').map(|(_, s)| s)) {
            Some(segment) => segment.parse().ok(),
            None => Some(0),
        }
    }
}

/// The JWT claims the upstream receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationClaims {
    pub jti: String,
    pub sub: String,
    pub act: String,
    /// The variant bought, on an activity with variants; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub var: Option<String>,
    /// The phase it was bought in, on an activity sold in phases; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    pub qty: u32,
    pub ver: u64,
    pub iat: u64,
    pub exp: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot sign reservation: {0}")]
pub struct SignError(#[from] jsonwebtoken::errors::Error);

/// Signs reservations with the configured key. What does not change from one token to the
/// next is made once per key: the header segment (`base64url(header JSON) "."`) and, for the
/// HMAC algorithms, the keyed MAC (its padded key blocks hashed), cloned per token. A token is
/// byte for byte what `jsonwebtoken::encode` makes with the same header, claims and key (a
/// test holds them equal).
pub struct Signer {
    header_segment: String,
    key: EncodingKey,
    algorithm: Algorithm,
    mac: Option<KeyedMac>,
    ttl: Duration,
}

/// An HMAC keyed once, for the `HS*` algorithms.
enum KeyedMac {
    Hs256(hmac::Hmac<sha2::Sha256>),
    Hs384(hmac::Hmac<sha2::Sha384>),
    Hs512(hmac::Hmac<sha2::Sha512>),
}

impl KeyedMac {
    fn new(algorithm: Algorithm, key: &EncodingKey) -> Option<KeyedMac> {
        use hmac::KeyInit;
        let secret = key.as_bytes();
        match algorithm {
            Algorithm::HS256 => hmac::Hmac::new_from_slice(secret).ok().map(KeyedMac::Hs256),
            Algorithm::HS384 => hmac::Hmac::new_from_slice(secret).ok().map(KeyedMac::Hs384),
            Algorithm::HS512 => hmac::Hmac::new_from_slice(secret).ok().map(KeyedMac::Hs512),
            _ => None,
        }
    }

    /// The MAC of `message` (at most 64 bytes: HS512's).
    fn sign(&self, message: &[u8]) -> MacBytes {
        use hmac::Mac;
        let mut out = MacBytes::default();
        let bytes: &[u8] = match self {
            KeyedMac::Hs256(mac) => &mac.clone().chain_update(message).finalize().into_bytes(),
            KeyedMac::Hs384(mac) => &mac.clone().chain_update(message).finalize().into_bytes(),
            KeyedMac::Hs512(mac) => &mac.clone().chain_update(message).finalize().into_bytes(),
        };
        out.bytes[..bytes.len()].copy_from_slice(bytes);
        out.len = bytes.len();
        out
    }
}

/// A MAC's bytes, on the stack.
struct MacBytes {
    bytes: [u8; 64],
    len: usize,
}

impl Default for MacBytes {
    fn default() -> Self {
        MacBytes {
            bytes: [0; 64],
            len: 0,
        }
    }
}

impl AsRef<[u8]> for MacBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Signer {
    pub fn new(settings: &SigningSettings) -> Signer {
        use base64::Engine;
        let mut header = Header::new(settings.algorithm);
        header.kid = Some(settings.key_id.clone());
        header.typ = Some("JWT".to_owned());
        let json = serde_json::to_vec(&header).expect("a JWT header serialises");
        let mut header_segment = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        header_segment.push('.');
        Signer {
            header_segment,
            mac: KeyedMac::new(settings.algorithm, &settings.key),
            key: settings.key.clone(),
            algorithm: settings.algorithm,
            ttl: settings.ttl,
        }
    }

    /// The compact JWS for a reservation: `iat` is when Redis made it (a replay signs the same
    /// claims again), `exp = iat + ttl_secs`, but never past the hold deadline (with a
    /// `hold_secs` shorter than `ttl_secs`), so a backend that checks `exp` never accepts a
    /// reservation whose units may have gone back on sale. No gateway clock is read.
    pub fn sign(&self, reservation: &Reservation) -> Result<String, SignError> {
        let iat = reservation.created_ms / 1000;
        let exp = (iat + self.ttl.as_secs()).min(reservation.deadline_ms / 1000);
        self.sign_claims(reservation, iat, exp)
    }

    /// The JWKS (RFC 7517) of the Ed25519 keys backends may verify reservations with.
    pub fn jwks(keys: &[crate::config::PublishedKey]) -> serde_json::Value {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let keys: Vec<serde_json::Value> = keys
            .iter()
            .map(|k| {
                serde_json::json!({
                    "kty": "OKP",
                    "crv": "Ed25519",
                    "alg": "EdDSA",
                    "use": "sig",
                    "kid": k.kid,
                    "x": b64.encode(k.public_key),
                })
            })
            .collect();
        serde_json::json!({ "keys": keys })
    }

    fn sign_claims(&self, r: &Reservation, iat: u64, exp: u64) -> Result<String, SignError> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let claims = ClaimsOf {
            jti: &r.id,
            sub: &r.user,
            act: &r.activity,
            var: r.variant.as_deref(),
            phase: r.phase.as_deref(),
            qty: r.qty,
            ver: r.version,
            iat,
            exp,
        };
        let json = serde_json::to_vec(&claims).map_err(jsonwebtoken::errors::Error::from)?;
        let mut token = String::with_capacity(self.header_segment.len() + json.len() * 4 / 3 + 96);
        token.push_str(&self.header_segment);
        b64.encode_string(&json, &mut token);
        match &self.mac {
            Some(mac) => {
                let signature = mac.sign(token.as_bytes());
                token.push('.');
                b64.encode_string(signature, &mut token);
            }
            None => {
                let signature =
                    jsonwebtoken::crypto::sign(token.as_bytes(), &self.key, self.algorithm)?;
                token.push('.');
                token.push_str(&signature);
            }
        }
        Ok(token)
    }
}

/// [`ReservationClaims`] as the signer writes them, borrowed from the reservation (the same
/// fields in the same order, so the same JSON), with no copy of its strings.
#[derive(Serialize)]
struct ClaimsOf<'a> {
    jti: &'a str,
    sub: &'a str,
    act: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    var: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<&'a str>,
    qty: u32,
    ver: u64,
    iat: u64,
    exp: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};

    #[test]
    fn an_id_names_its_variant_and_segment_even_with_dots_and_as_older_ids_did() {
        fn read(id: &str) -> (Option<&str>, Option<u32>) {
            (Reservation::variant_of(id), Reservation::segment_of(id))
        }
        let u = "01a250ad-3475-7559-9167-c4a320a8dfb9";
        // Made now: a variant with a dot, unsegmented and segmented; no variant.
        assert_eq!(read(&format!("{u}~40.5~0")), (Some("40.5"), Some(0)));
        assert_eq!(read(&format!("{u}~40.5~3")), (Some("40.5"), Some(3)));
        assert_eq!(read(&format!("{u}~40~12")), (Some("40"), Some(12)));
        assert_eq!(read(&format!("{u}.2")), (None, Some(2)));
        assert_eq!(read(u), (None, Some(0)));
        // An older flashgate's (variant ids had no dots).
        assert_eq!(read(&format!("{u}~42")), (Some("42"), Some(0)));
        assert_eq!(read(&format!("{u}~42.1")), (Some("42"), Some(1)));
    }

    fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    fn reservation() -> Reservation {
        let created_ms = now_ms();
        Reservation {
            id: Reservation::new_id(),
            user: "alice".into(),
            activity: Arc::from("1001"),
            variant: None,
            segment: 0,
            qty: 2,
            version: 3,
            owned: true,
            created_ms,
            deadline_ms: created_ms + 900_000,
            fence: 1,
            phase: None,
        }
    }

    #[test]
    fn hs256_token_verifies_with_standard_validation() {
        let settings = SigningSettings {
            header: http::HeaderName::from_static("x-flashgate-reservation"),
            algorithm: Algorithm::HS256,
            key_id: "k1".into(),
            key: EncodingKey::from_secret(b"s3cret").unwrap(),
            ttl: Duration::from_secs(900),
            published_keys: vec![],
            ticket_key: [7; 32],
        };
        let r = reservation();
        let token = Signer::new(&settings).sign(&r).unwrap();
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.kid.as_deref(), Some("k1"));
        assert_eq!(header.typ.as_deref(), Some("JWT"));
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub", "jti"]);
        let data = jsonwebtoken::decode::<ReservationClaims>(
            &token,
            &DecodingKey::from_secret(b"s3cret").unwrap(),
            &validation,
        )
        .unwrap();
        assert_eq!(data.claims.jti, r.id);
        assert_eq!(data.claims.sub, "alice");
        assert_eq!(
            (data.claims.act.as_str(), data.claims.qty, data.claims.ver),
            ("1001", 2, 3)
        );
        assert_eq!(data.claims.exp, data.claims.iat + 900);
        // A different secret must not verify.
        assert!(jsonwebtoken::decode::<ReservationClaims>(
            &token,
            &DecodingKey::from_secret(b"other").unwrap(),
            &validation
        )
        .is_err());
    }

    /// The prepared header segment and keyed MAC make exactly the token `jsonwebtoken::encode`
    /// makes, for every algorithm the gateway signs with.
    #[test]
    fn a_token_is_what_jsonwebtoken_encode_makes() {
        use ed25519_dalek::pkcs8::EncodePrivateKey;
        let ed = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
        let ed_der = ed.to_pkcs8_der().unwrap();
        let keys = [
            (
                Algorithm::HS256,
                EncodingKey::from_secret(b"s3cret").unwrap(),
            ),
            (
                Algorithm::HS384,
                EncodingKey::from_secret(b"s3cret").unwrap(),
            ),
            (
                Algorithm::HS512,
                EncodingKey::from_secret(b"s3cret").unwrap(),
            ),
            (
                Algorithm::EdDSA,
                EncodingKey::from_ed_der(ed_der.as_bytes()),
            ),
        ];
        for (algorithm, key) in keys {
            let settings = SigningSettings {
                header: http::HeaderName::from_static("x-flashgate-reservation"),
                algorithm,
                key_id: "k\"1".into(),
                key: key.clone(),
                ttl: Duration::from_secs(900),
                published_keys: vec![],
                ticket_key: [7; 32],
            };
            let mut r = reservation();
            r.user = "al\u{e9}ice \"quoted\"".into();
            let ours = Signer::new(&settings).sign(&r).unwrap();
            let mut header = Header::new(algorithm);
            header.kid = Some("k\"1".into());
            header.typ = Some("JWT".to_owned());
            let iat = r.created_ms / 1000;
            let claims = ReservationClaims {
                jti: r.id.clone(),
                sub: r.user.clone(),
                act: r.activity.to_string(),
                var: r.variant.as_deref().map(str::to_owned),
                phase: r.phase.as_deref().map(str::to_owned),
                qty: r.qty,
                ver: r.version,
                iat,
                exp: iat + 900,
            };
            let theirs = jsonwebtoken::encode(&header, &claims, &key).unwrap();
            assert_eq!(ours, theirs, "{algorithm:?}");
        }
    }

    #[test]
    fn a_token_is_dated_by_redis_and_never_outlives_the_hold() {
        let settings = SigningSettings {
            header: http::HeaderName::from_static("x-flashgate-reservation"),
            algorithm: Algorithm::HS256,
            key_id: "k1".into(),
            key: EncodingKey::from_secret(b"s3cret").unwrap(),
            ttl: Duration::from_secs(900),
            published_keys: vec![],
            ticket_key: [7; 32],
        };
        let signer = Signer::new(&settings);
        let claims = |r: &Reservation| {
            let token = signer.sign(r).unwrap();
            jsonwebtoken::dangerous::insecure_decode::<ReservationClaims>(&token)
                .unwrap()
                .claims
        };
        let r = reservation();
        let c = claims(&r);
        assert_eq!(c.iat, r.created_ms / 1000);
        assert_eq!(c.exp, c.iat + 900, "exp = iat + ttl_secs");
        assert_eq!(claims(&r), c, "a replay signs the same claims");
        let short = Reservation {
            deadline_ms: r.created_ms + 60_000,
            ..r
        };
        assert_eq!(
            claims(&short).exp,
            short.deadline_ms / 1000,
            "a hold shorter than the ttl"
        );
    }

    #[test]
    fn ids_are_unique() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| Reservation::new_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
