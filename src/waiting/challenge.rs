//! Proof of work before a ticket, in the ALTCHA scheme (v1, so existing widgets and solvers
//! work): the gateway picks a secret `number` in `0..=max_number`, sends
//! `challenge = hex(sha256(salt + number))`, the `salt` and `signature = hex(hmac_sha256(key,
//! challenge))`; the client tries numbers until one hashes to `challenge` and sends back
//! `base64({"algorithm","challenge","number","salt","signature"})`.
//!
//! The salt carries its binding ALTCHA style, `<random>?a=<activity>&e=<epoch>&u=<user tag>&
//! t=<issued ms>&x=<expires ms>` (the user as an HMAC tag, not in clear): the signature covers
//! the challenge, which covers the salt, so none of it can be changed. Issuing costs no Redis
//! (nothing is stored), verifying costs two hashes and an HMAC (microseconds) and no Redis
//! read; that a solution is used once is the one Redis write of the ticket script (`SET NX`
//! of the challenge until it expires, `lua/queue_ticket.lua`). Own few lines over `sha2` and
//! `hmac` (already dependencies) rather than a crate.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The only algorithm offered and accepted.
pub const ALGORITHM: &str = "SHA-256";
/// Longest `X-Flashgate-Solution` header read (base64 of a payload of a few hundred bytes).
pub const MAX_SOLUTION_LEN: usize = 1024;

/// A challenge as sent to the buyer (the 202's `challenge`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Challenge {
    pub algorithm: &'static str,
    pub challenge: String,
    pub salt: String,
    pub signature: String,
    pub max_number: u64,
}

/// What a challenge is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    pub activity: &'a str,
    pub user: &'a str,
    /// The queue's epoch (a queue Redis lost and set up again takes none of its solutions).
    pub epoch: u64,
}

/// A solution that checked out: its challenge (the single-use key) and until when it counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solved {
    pub challenge: String,
    pub expires_ms: u64,
}

/// Why a solution was refused (all answered 403 `invalid_ticket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("not a solution (base64 of the ALTCHA JSON payload)")]
    Malformed,
    #[error("the signature does not match: not a challenge of this gateway")]
    Forged,
    #[error("the number does not solve the challenge")]
    Wrong,
    #[error("a challenge of another user, activity or queue")]
    OtherBinding,
    #[error("the challenge expired")]
    Expired,
    #[error("a challenge issued before the queue opened")]
    Early,
}

/// The key challenges are signed with, derived from the ticket key (every gateway has it).
pub fn key(ticket_key: &[u8; 32]) -> [u8; 32] {
    let mut mac = hmac32(ticket_key);
    mac.update(b"flashgate challenge key v1");
    mac.finalize().into_bytes().into()
}

fn hmac32(key: &[u8]) -> hmac::Hmac<Sha256> {
    hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length")
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The user as the salt names them: 16 bytes of an HMAC, hex.
fn user_tag(key: &[u8; 32], user: &str) -> String {
    let mut mac = hmac32(key);
    mac.update(b"user\n");
    mac.update(user.as_bytes());
    hex(&mac.finalize().into_bytes()[..16])
}

fn signature(key: &[u8; 32], challenge: &str) -> String {
    let mut mac = hmac32(key);
    mac.update(challenge.as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// `hex(sha256(salt + number))`.
pub fn hash(salt: &str, number: u64) -> String {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(number.to_string().as_bytes());
    hex(&h.finalize())
}

/// A new challenge for `to`, issued at `now_ms`, good until `expires_ms`.
pub fn issue(
    key: &[u8; 32],
    to: Binding<'_>,
    now_ms: u64,
    expires_ms: u64,
    max_number: u64,
) -> Challenge {
    let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
    let salt = format!(
        "{:012x}?a={}&e={}&u={}&t={now_ms}&x={expires_ms}",
        a >> 16,
        to.activity,
        to.epoch,
        user_tag(key, to.user)
    );
    let number = b % (max_number + 1);
    let challenge = hash(&salt, number);
    Challenge {
        algorithm: ALGORITHM,
        signature: signature(key, &challenge),
        challenge,
        salt,
        max_number,
    }
}

#[derive(serde::Deserialize)]
struct Payload {
    algorithm: String,
    challenge: String,
    number: u64,
    salt: String,
    signature: String,
}

/// Checks the `X-Flashgate-Solution` header `raw` sent by `by`, at `now_ms`, for a queue
/// open since `opens_ms`.
pub fn verify(
    key: &[u8; 32],
    by: Binding<'_>,
    raw: &str,
    now_ms: u64,
    opens_ms: u64,
) -> Result<Solved, Refused> {
    if raw.len() > MAX_SOLUTION_LEN {
        return Err(Refused::Malformed);
    }
    let raw = raw.trim();
    let bytes = STANDARD
        .decode(raw)
        .or_else(|_| URL_SAFE_NO_PAD.decode(raw.trim_end_matches('=')))
        .map_err(|_| Refused::Malformed)?;
    let p: Payload = serde_json::from_slice(&bytes).map_err(|_| Refused::Malformed)?;
    if p.algorithm != ALGORITHM {
        return Err(Refused::Malformed);
    }
    // The signature first (constant time): nothing else of a forged payload is looked at.
    let mut mac = hmac32(key);
    mac.update(p.challenge.as_bytes());
    let sig = decode_hex(&p.signature).ok_or(Refused::Forged)?;
    mac.verify_slice(&sig).map_err(|_| Refused::Forged)?;
    if hash(&p.salt, p.number) != p.challenge {
        return Err(Refused::Wrong);
    }
    let (_, params) = p.salt.split_once('?').ok_or(Refused::Malformed)?;
    let param = |name: &str| {
        params
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    let number = |name: &str| param(name).and_then(|v| v.parse::<u64>().ok());
    let epoch = by.epoch.to_string();
    if param("a") != Some(by.activity)
        || param("e") != Some(epoch.as_str())
        || param("u") != Some(user_tag(key, by.user).as_str())
    {
        return Err(Refused::OtherBinding);
    }
    let (Some(issued_ms), Some(expires_ms)) = (number("t"), number("x")) else {
        return Err(Refused::Malformed);
    };
    if issued_ms < opens_ms {
        return Err(Refused::Early);
    }
    if now_ms >= expires_ms {
        return Err(Refused::Expired);
    }
    Ok(Solved {
        challenge: p.challenge,
        expires_ms,
    })
}

/// Bytes of a hex string.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Solves a challenge by trying every number (what a browser's worker does), as the header
/// value to send: for tests and tools.
pub fn solve(c: &Challenge) -> Option<String> {
    let number = (0..=c.max_number).find(|n| hash(&c.salt, *n) == c.challenge)?;
    let payload = serde_json::json!({
        "algorithm": c.algorithm,
        "challenge": c.challenge,
        "number": number,
        "salt": c.salt,
        "signature": c.signature,
    });
    Some(STANDARD.encode(payload.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [9; 32];

    fn alice() -> Binding<'static> {
        Binding {
            activity: "1001",
            user: "alice",
            epoch: 42,
        }
    }

    #[test]
    fn a_solution_binds_to_its_user_activity_epoch_and_time() {
        let c = issue(&KEY, alice(), 1_000, 60_000, 500);
        let s = solve(&c).expect("solvable");
        let ok = verify(&KEY, alice(), &s, 2_000, 1_000).unwrap();
        assert_eq!(ok.challenge, c.challenge);
        assert_eq!(ok.expires_ms, 60_000);
        for other in [
            Binding {
                user: "bob",
                ..alice()
            },
            Binding {
                activity: "1002",
                ..alice()
            },
            Binding {
                epoch: 43,
                ..alice()
            },
        ] {
            assert_eq!(
                verify(&KEY, other, &s, 2_000, 1_000),
                Err(Refused::OtherBinding)
            );
        }
        assert_eq!(
            verify(&KEY, alice(), &s, 60_000, 1_000),
            Err(Refused::Expired)
        );
        assert_eq!(verify(&KEY, alice(), &s, 2_000, 1_001), Err(Refused::Early));
        assert_eq!(
            verify(&[8; 32], alice(), &s, 2_000, 1_000),
            Err(Refused::Forged)
        );
    }

    #[test]
    fn wrong_numbers_changed_salts_and_garbage_are_refused() {
        let c = issue(&KEY, alice(), 1_000, 60_000, 50);
        let right = (0..=50).find(|n| hash(&c.salt, *n) == c.challenge).unwrap();
        let payload = |number: u64, salt: &str| {
            STANDARD.encode(
                serde_json::json!({"algorithm": "SHA-256", "challenge": c.challenge,
                    "number": number, "salt": salt, "signature": c.signature})
                .to_string(),
            )
        };
        assert_eq!(
            verify(&KEY, alice(), &payload(right + 1, &c.salt), 2_000, 0),
            Err(Refused::Wrong)
        );
        // Another user's tag put in the salt: the hash no longer matches the signed challenge.
        let bob = c
            .salt
            .replace(&user_tag(&KEY, "alice"), &user_tag(&KEY, "bob"));
        let bob_binding = Binding {
            user: "bob",
            ..alice()
        };
        assert_eq!(
            verify(&KEY, bob_binding, &payload(right, &bob), 2_000, 0),
            Err(Refused::Wrong)
        );
        for junk in ["", "!!!", "e30=", &"A".repeat(2_000)] {
            assert_eq!(
                verify(&KEY, alice(), junk, 2_000, 0),
                Err(Refused::Malformed),
                "{junk}"
            );
        }
    }

    /// The contract's ALTCHA arithmetic, checked against a value computed by hand
    /// (`printf 'abc123' | sha256sum`).
    #[test]
    fn the_hash_is_altchas() {
        assert_eq!(
            hash("abc", 123),
            "6ca13d52ca70c883e0f0bb101e425a89e8624de51db2d2392593af6a84118090"
        );
    }
}
