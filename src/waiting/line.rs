//! The second chance (`activities[].second_chance`): after a lane sold out, a buyer told
//! `sold_out` may join its line (`POST /flashgate/line/{activity}[/{variant}]`); each unit that
//! comes back is held for the next buyer in line for the window, then passes to the one after,
//! and nobody outside the line gets a returned unit while anyone waits in it (judged in Redis
//! with the stock, `lua/line.lua` and `lua/reserve.lua`). A buyer polls where they stand
//! (`GET` on the same address) and buys as anyone does, presenting the ticket the join gave
//! (`X-Flashgate-Ticket`, or the `flashgate_ticket` cookie): with it, a purchase is never
//! answered sold out from memory, so a buyer holding a unit reaches the script that sells it.
//!
//! Tickets: `l1.<mac>`, an HMAC-SHA256 (truncated to 128 bits) over the lane and the user,
//! keyed by the ticket key every gateway derives from the signing key: a ticket names nothing
//! the buyer could change, works only for them and only for that lane, and cannot be made up.

use crate::config::Activity;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{KeyInit, Mac};
use serde::Serialize;

/// Where a lane's line is joined and polled.
pub const PREFIX: &str = "/flashgate/line/";

/// The address of `lane`'s line (`None`: the activity has no second chance).
pub fn join_url(lane: &Activity) -> Option<String> {
    lane.second_chance?;
    Some(match &lane.variant {
        Some(v) => format!("{PREFIX}{}/{v}", lane.id),
        None => format!("{PREFIX}{}", lane.id),
    })
}

fn mac(key: &[u8; 32], lane: &str, user: &str) -> [u8; 16] {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("32-byte key");
    mac.update(format!("l1\n{lane}\n{}\n{user}", user.len()).as_bytes());
    mac.finalize().into_bytes()[..16]
        .try_into()
        .expect("16 bytes")
}

/// `user`'s ticket for `lane`'s line.
pub fn ticket(key: &[u8; 32], lane: &str, user: &str) -> String {
    format!("l1.{}", URL_SAFE_NO_PAD.encode(mac(key, lane, user)))
}

/// Whether `presented` is `user`'s ticket for `lane`'s line (compared in constant time).
pub fn holds_ticket(key: &[u8; 32], lane: &str, user: &str, presented: &str) -> bool {
    let Some(tag) = presented
        .strip_prefix("l1.")
        .and_then(|t| URL_SAFE_NO_PAD.decode(t).ok())
    else {
        return false;
    };
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("32-byte key");
    mac.update(format!("l1\n{lane}\n{}\n{user}", user.len()).as_bytes());
    mac.verify_truncated_left(&tag).is_ok() && tag.len() == 16
}

/// How often every gateway moves each line on (a hold that ran out passes to the next buyer,
/// a unit that came back becomes the head's): with several gateways, more often.
pub const ADVANCE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl super::WaitingRoom {
    /// `ask` of `user` in `lane`'s second-chance line (see `lua/line.lua`).
    pub async fn line(
        &self,
        lane: &Activity,
        ask: crate::stock::LineAsk,
        user: &str,
    ) -> Result<crate::stock::LineView, crate::stock::StoreError> {
        self.store.line(lane, ask, user).await
    }

    /// Moves every second-chance line on (each lane of each activity with one, until it ends),
    /// and sets the line gauges from what each answered.
    pub async fn advance_lines(&self, settings: &crate::config::Settings) {
        let now = self.store.clock().now();
        for activity in settings.activities.iter() {
            if activity.second_chance.is_none() || now >= activity.ends_at || now < activity.opens()
            {
                continue;
            }
            let (mut waiting, mut held) = (Some(0), Some(0));
            for lane in settings.activities.lanes_of(&activity.id) {
                match self
                    .store
                    .line(lane, crate::stock::LineAsk::Advance, "")
                    .await
                {
                    Ok(view) => {
                        waiting = waiting.map(|w| w + view.waiting);
                        held = held.map(|h| h + view.held);
                    }
                    Err(e) => {
                        (waiting, held) = (None, None);
                        tracing::warn!(activity = %lane.id, variant = lane.variant.as_deref(),
                            error = %e, "second-chance line not moved on");
                    }
                }
            }
            let labels = [&*activity.id];
            if let (Some(w), Some(h)) = (waiting, held) {
                self.metrics
                    .line_waiting
                    .with_label_values(&labels)
                    .set(w as i64);
                self.metrics
                    .line_held
                    .with_label_values(&labels)
                    .set(h as i64);
            }
        }
    }
}

/// The lane a line's address names: (activity, variant), if the target is one.
pub fn addressed(segments: &[String]) -> Option<(&str, Option<&str>)> {
    match segments {
        [a, b, act] if a == "flashgate" && b == "line" => Some((act, None)),
        [a, b, act, variant] if a == "flashgate" && b == "line" => Some((act, Some(variant))),
        _ => None,
    }
}

/// What a line's join or poll answers (JSON): the buyer's place and, at the head, what is
/// left of the unit held for them.
#[derive(Debug, Clone, Serialize)]
pub struct LineAnswer {
    /// `queued` while waiting; `your_turn` while a unit is held for the buyer.
    pub code: &'static str,
    pub message: String,
    pub ticket: String,
    /// 1: next; 0: not in the line (bought, or their hold ran out).
    pub place: u64,
    pub waiting: u64,
    /// Units held for the line's first buyers now.
    pub held: u64,
    /// What is left of the unit held for the buyer (ms), while it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_left_ms: Option<u64>,
    /// Where to buy (the sale route), once it is the buyer's turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buy: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_the_buyers_for_the_lane_only() {
        let key = [7u8; 32];
        let t = ticket(&key, "drop~42", "alice");
        assert!(holds_ticket(&key, "drop~42", "alice", &t));
        assert!(!holds_ticket(&key, "drop~43", "alice", &t));
        assert!(!holds_ticket(&key, "drop~42", "bob", &t));
        assert!(!holds_ticket(&[8u8; 32], "drop~42", "alice", &t));
        assert!(!holds_ticket(&key, "drop~42", "alice", "l1."));
        assert!(!holds_ticket(&key, "drop~42", "alice", &t[..t.len() - 2]));
        assert!(!holds_ticket(&key, "drop~42", "alice", "t1.drop.1.2.3.x"));
    }
}
