//! Waiting-room tickets: `t1.<activity>.<number>.<issued_ms>.<epoch>.<mac>`, the MAC an
//! HMAC-SHA256 (truncated to 128 bits) over the activity, the user, the number, the issue time
//! and the queue's epoch (a random id written when the queue was set up: a ticket of a queue
//! Redis lost and set up again holds no place in the new one), keyed by the ticket key every
//! gateway derives from the signing key. The user is not in the ticket
//! but in the MAC: a ticket works only for the buyer it was issued to, only for its activity,
//! and cannot be made up.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{KeyInit, Mac};

/// Longest ticket accepted (an activity id is at most 64 bytes).
pub const MAX_TICKET_LEN: usize = 160;

/// A ticket's contents, once its MAC checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub number: u64,
    /// When it was issued (Redis's clock, unix ms).
    pub issued_ms: u64,
    /// The queue's epoch it was issued in.
    pub epoch: u64,
}

/// Why a ticket was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// Not a ticket, or its MAC does not match (forged, or another user's).
    Forged,
    /// A genuine ticket of another activity.
    OtherActivity,
}

fn mac(key: &[u8; 32], activity: &str, user: &str, t: Ticket) -> [u8; 16] {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("32-byte key");
    let Ticket {
        number,
        issued_ms,
        epoch,
    } = t;
    mac.update(
        format!(
            "t1\n{activity}\n{}\n{user}\n{number}\n{issued_ms}\n{epoch}",
            user.len()
        )
        .as_bytes(),
    );
    mac.finalize().into_bytes()[..16]
        .try_into()
        .expect("16 bytes")
}

/// The ticket string for `user`'s `number` in `activity`.
pub fn sign(key: &[u8; 32], activity: &str, user: &str, ticket: Ticket) -> String {
    let tag = mac(key, activity, user, ticket);
    format!(
        "t1.{activity}.{}.{}.{}.{}",
        ticket.number,
        ticket.issued_ms,
        ticket.epoch,
        URL_SAFE_NO_PAD.encode(tag)
    )
}

/// Checks a ticket presented by `user` for `activity`.
pub fn verify(key: &[u8; 32], activity: &str, user: &str, raw: &str) -> Result<Ticket, Invalid> {
    if raw.len() > MAX_TICKET_LEN {
        return Err(Invalid::Forged);
    }
    let mut parts = raw.split('.');
    let (Some("t1"), Some(act), Some(number), Some(issued), Some(epoch), Some(tag), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(Invalid::Forged);
    };
    let number: u64 = number.parse().map_err(|_| Invalid::Forged)?;
    let issued_ms: u64 = issued.parse().map_err(|_| Invalid::Forged)?;
    let epoch: u64 = epoch.parse().map_err(|_| Invalid::Forged)?;
    let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Invalid::Forged)?;
    let ticket = Ticket {
        number,
        issued_ms,
        epoch,
    };
    let expected = mac(key, act, user, ticket);
    // Constant-time comparison.
    let same = tag.len() == expected.len()
        && tag
            .iter()
            .zip(expected.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !same {
        return Err(Invalid::Forged);
    }
    if act != activity {
        return Err(Invalid::OtherActivity);
    }
    Ok(ticket)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const T: Ticket = Ticket {
        number: 42,
        issued_ms: 1_700_000_000_000,
        epoch: 99,
    };

    #[test]
    fn a_ticket_works_for_its_buyer_and_activity_only() {
        let raw = sign(&KEY, "1001", "alice", T);
        assert_eq!(verify(&KEY, "1001", "alice", &raw), Ok(T));
        assert_eq!(verify(&KEY, "1001", "bob", &raw), Err(Invalid::Forged));
        assert_eq!(
            verify(&KEY, "2002", "alice", &raw),
            Err(Invalid::OtherActivity)
        );
        assert_eq!(
            verify(&[8; 32], "1001", "alice", &raw),
            Err(Invalid::Forged)
        );
    }

    #[test]
    fn changed_or_malformed_tickets_are_forged() {
        let raw = sign(&KEY, "1001", "alice", T);
        let moved = raw.replace(".42.", ".1.");
        assert_eq!(verify(&KEY, "1001", "alice", &moved), Err(Invalid::Forged));
        for bad in [
            "",
            "t1",
            "t1.1001.42.1",
            "t1.1001.42.1.AAAA",
            "t2.1001.42.1.9.AAAA",
            "t1.1001.x.1.9.AAAA",
            &"t".repeat(500),
        ] {
            assert_eq!(
                verify(&KEY, "1001", "alice", bad),
                Err(Invalid::Forged),
                "{bad}"
            );
        }
        let extra = format!("{raw}.x");
        assert_eq!(verify(&KEY, "1001", "alice", &extra), Err(Invalid::Forged));
    }

    #[test]
    fn user_ids_cannot_be_shifted_into_the_number() {
        // "al" + "ice" and "ali" + "ce" must not collide: the user's length is in the MAC.
        let t = |number| Ticket {
            number,
            issued_ms: 3,
            epoch: 4,
        };
        let a = mac(&KEY, "1001", "al\n1", t(2));
        let b = mac(&KEY, "1001", "al", t(12));
        assert_ne!(a, b);
    }
}
