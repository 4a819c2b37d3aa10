//! A buyer's bearer token, verified: from an `Authorization: Bearer` header or the session
//! cookie, by the configured keys (by `kid`; the token's `alg` must be its key's, never
//! "none"), with `exp` required and `nbf`, `iss`, `aud` checked where given; the user id is the
//! configured claim. One identity per request: a request naming two buyers is refused, never
//! read first-wins (see [`Unidentified::Ambiguous`]).

use crate::config::JwtIdentitySettings;
use http::{header, HeaderMap};
use jsonwebtoken::{DecodingKey, Validation};

/// Longest user id accepted, from a header or a token claim.
pub const MAX_USER_ID_LEN: usize = 128;
/// Longest identity token accepted (a guard against giant headers and cookies).
pub(super) const MAX_TOKEN_LEN: usize = 8 * 1024;

/// Why a request names no buyer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unidentified {
    /// No identity, or one that does not verify (answered `unauthenticated`).
    Missing,
    /// More than one: two `Authorization` headers, a bearer token and a session cookie of
    /// different buyers, or the session cookie twice with different values (answered
    /// `bad_request`: the gateway never picks one while the backend may read another).
    Ambiguous,
}

impl Unidentified {
    /// What the buyer is told: none (401 `unauthenticated`), or two (400 `bad_request`).
    pub fn decision(self) -> crate::decision::Decision {
        use crate::decision::{BadRequest, Decision};
        match self {
            Unidentified::Missing => Decision::Unauthenticated,
            Unidentified::Ambiguous => Decision::BadRequest(BadRequest::IdentityAmbiguous),
        }
    }
}

/// A user id as the gateway accepts it: non-empty after trimming, at most
/// [`MAX_USER_ID_LEN`] bytes of visible ASCII and spaces.
pub(super) fn user_id(raw: &str) -> Option<&str> {
    let user = raw.trim();
    let valid = !user.is_empty()
        && user.len() <= MAX_USER_ID_LEN
        && user.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    valid.then_some(user)
}

pub(super) struct JwtVerifier {
    keys: Vec<(String, DecodingKey, Validation)>,
    claim: String,
    cookie: Option<String>,
}

impl JwtVerifier {
    pub(super) fn new(settings: &JwtIdentitySettings) -> Self {
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

    /// The buyer one request names: the bearer token's, else the session cookie's; refused
    /// when it names two (see [`Unidentified::Ambiguous`]).
    pub(super) fn identify(&self, headers: &HeaderMap) -> Result<Buyer, Unidentified> {
        let mut auth = headers.get_all(header::AUTHORIZATION).iter();
        let (bearer, more) = (auth.next(), auth.next());
        if more.is_some() {
            return Err(Unidentified::Ambiguous);
        }
        let (cookies, read_as) = match &self.cookie {
            Some(name) => (
                crate::header_names::cookies(headers, name),
                crate::header_names::cookies_read_as(headers, name),
            ),
            None => (Vec::new(), Vec::new()),
        };
        // Any cookie another framework reads as the session one (`Session`, `%73ession`,
        // ` session`) counts: two values are two identities, whichever one a backend picks.
        if read_as.iter().any(|c| *c != read_as[0]) {
            return Err(Unidentified::Ambiguous);
        }
        let from_cookie = || cookies.first().and_then(|t| self.verify(t));
        let Some(bearer) = bearer else {
            return from_cookie().ok_or(Unidentified::Missing);
        };
        let verified = bearer_token(bearer).and_then(|t| self.verify(t));
        if let Some(verified) = &verified {
            // Any cookie some framework reads as the session one, beside a bearer: it must name
            // the same buyer (or nobody: a stale cookie).
            let other = read_as
                .iter()
                .filter_map(|t| self.verify(t))
                .any(|o| o.user != verified.user);
            if other {
                return Err(Unidentified::Ambiguous);
            }
        }
        let verified = verified.ok_or(Unidentified::Missing)?;
        match from_cookie() {
            Some(other) if other.user != verified.user => Err(Unidentified::Ambiguous),
            _ => Ok(verified),
        }
    }

    fn verify(&self, token: &str) -> Option<Buyer> {
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
        let data = jsonwebtoken::decode::<Claims>(token, key, validation).ok()?;
        // A claim is the user id as signed: surrounding whitespace is not trimmed into another
        // user's id (a token for " alice" is not alice's), it is refused.
        let claimed = data.claims.get(&self.claim)?.as_str()?;
        let user = user_id(claimed)
            .filter(|id| id.len() == claimed.len())?
            .to_owned();
        Some(Buyer {
            user,
            claims: data.claims,
        })
    }
}

/// A verified token's claims.
pub type Claims = serde_json::Map<String, serde_json::Value>;

/// A buyer as the request names them: their user id, and the verified token's other claims
/// (none for an identity header), read by the phases of a sale (`who: {claim: ...}`).
#[derive(Debug, Default)]
pub struct Buyer {
    pub user: String,
    pub claims: Claims,
}

impl Buyer {
    /// A buyer named by a header, with no claims.
    pub fn named(user: String) -> Buyer {
        Buyer {
            user,
            claims: Claims::new(),
        }
    }
}

/// The values of claim `name` as text: a string, a number or a boolean (`1`, `true`, as YAML
/// writes them in `any_of`), or each of those in an array of them.
pub fn claim_values<'a>(
    claims: &'a Claims,
    name: &str,
) -> impl Iterator<Item = std::borrow::Cow<'a, str>> + 'a {
    use serde_json::Value;
    let text = |v: &'a Value| match v {
        Value::String(s) => Some(std::borrow::Cow::Borrowed(s.as_str())),
        Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string())),
        Value::Bool(b) => Some(std::borrow::Cow::Owned(b.to_string())),
        _ => None,
    };
    let value = claims.get(name);
    let many = value.and_then(|v| v.as_array());
    let one = value.filter(|_| many.is_none()).and_then(text);
    one.into_iter()
        .chain(many.into_iter().flatten().filter_map(text))
}

/// The token of an `Authorization: Bearer` header.
fn bearer_token(value: &http::HeaderValue) -> Option<&str> {
    let (scheme, token) = value.to_str().ok()?.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}
