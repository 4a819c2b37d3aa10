//! `lua/line.lua`: a lane's second-chance line (`activities[].second_chance`): joining it,
//! where a buyer stands in it, and moving it on (each returned unit held for the next buyer in
//! line for the window, then passed on). Its keys (in the order the script declares them), its
//! arguments and its reply, in one place; the script itself is in the registry (`super`).

use super::super::records::int;
use super::super::{Layout, ScriptName, SegmentKeys, StockStore, StoreError, StoreOp};
use crate::config::Activity;

impl SegmentKeys {
    pub fn for_line(&self, version: u64) -> [String; 6] {
        [
            self.stock(version),
            self.line(),
            self.line_holds(),
            self.ledger(version),
            self.users(),
            self.halt(),
        ]
    }
}

/// What a line call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineAsk {
    /// Join the line (only once the lane sold out, or while anyone waits in it).
    Join,
    /// Where the buyer stands.
    Poll,
    /// Move the line on (every gateway, every second).
    Advance,
}

/// The line's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineAnswer {
    /// Joined, or already in the line.
    Joined,
    Polled,
    Advanced,
    /// Units are on sale and nobody waits: the buyer should buy, not join.
    NotSoldOut,
    /// The buyer already holds the per-user limit: no unit could be theirs.
    AtLimit,
    /// A poll of a buyer not in the line (never joined, bought, or their hold ran out).
    NotInLine,
}

/// A line as one buyer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineView {
    pub answer: LineAnswer,
    /// The buyer's place (1: next), 0 when not in the line.
    pub place: u64,
    /// Buyers waiting in the line.
    pub waiting: u64,
    /// Units held for the line's first buyers now.
    pub held: u64,
    /// What is left of the buyer's hold (ms; 0: none): they may buy one unit meanwhile.
    pub hold_left_ms: u64,
}

impl StockStore {
    /// `ask` of `user` (`""` to advance) in the second-chance line of `lane` (an activity
    /// with `second_chance`, one segment), at the configured version.
    pub async fn line(
        &self,
        lane: &Activity,
        ask: LineAsk,
        user: &str,
    ) -> Result<LineView, StoreError> {
        let window = lane.second_chance.unwrap_or_default();
        let layout = Layout::of(lane);
        let segment = layout.segment(0).expect("a lane has a first segment");
        let mut invocation = super::LINE.prepare_invoke();
        for key in self.keys.of(segment).for_line(lane.version) {
            invocation.key(key);
        }
        let mode = match ask {
            LineAsk::Join => "join",
            LineAsk::Poll => "poll",
            LineAsk::Advance => "advance",
        };
        invocation
            .arg(mode)
            .arg(user)
            .arg(window.as_millis() as u64)
            .arg(self.expire_at(lane))
            .arg(lane.per_user_limit.get());
        let reply: Vec<redis::Value> = self
            .eval(ScriptName::Line, StoreOp::Line, &invocation)
            .await?;
        parse(&reply).ok_or_else(|| StoreError::protocol(ScriptName::Line, reply))
    }
}

fn parse(reply: &[redis::Value]) -> Option<LineView> {
    let at = |i: usize| int(reply.get(i));
    let unsigned = |i: usize| at(i).and_then(|v| u64::try_from(v).ok());
    let answer = match at(0)? {
        1 => LineAnswer::Joined,
        2 => LineAnswer::Polled,
        3 => LineAnswer::Advanced,
        -1 => LineAnswer::NotSoldOut,
        -2 => LineAnswer::AtLimit,
        -3 => LineAnswer::NotInLine,
        _ => return None,
    };
    Some(LineView {
        answer,
        place: unsigned(1)?,
        waiting: unsigned(2)?,
        held: unsigned(3)?,
        hold_left_ms: unsigned(4)?,
    })
}
