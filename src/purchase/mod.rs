//! The purchase pipeline: one owner for the question "may this sale request take stock?".
//!
//! A purchase runs through an ordered list of small gates ([`gates::run`], a file each), each
//! cheaper than the next: the client IP's bucket, who buys what, the quantity the query names,
//! the sale's hours, the fleet-wide halt, the buyer's bucket, the sold-out mark, the waiting room, the activity's
//! bucket, the whole body (read last of all, so refusals that need none never wait for it; a
//! quantity it names must agree), and the reserve (the only Redis round trip). A gate lets the
//! purchase go on, or answers it with the pipeline's one [`Verdict`]: refused, queued,
//! reserved, or forwarded unreserved. Adding a gate is one new file and its place in the list.
//!
//! The pipeline knows nothing of Pingora's session: what a gate reads of the request besides
//! its header (the body, read once on first ask) comes through [`Incoming`], which the proxy
//! implements over the session and the unit tests over a buffer. What the pipeline learns
//! (who, what, how many, what is left) is kept in [`SaleFacts`] for the answer and the log.

pub mod checkout;
pub mod gates;
pub mod request;
#[cfg(test)]
mod tests;

pub use checkout::{Checkout, SaleFacts, StockPort, StoreFacts};

use crate::client_policy::Rules;
use crate::config::{Activity, SaleRoute};
use crate::decision::{BadRequest, Decision};
use crate::edge::target::Target;
use crate::reservation::Reservation;
use crate::waiting::page::Queued as Reply;
use chrono::{DateTime, Utc};
use pingora::http::RequestHeader;
use std::net::IpAddr;
use std::sync::Arc;

pub use gates::waiting_room::{presented, solution, NoQueues, Room};

/// The request a purchase is made with, as far as gates read it beyond its route.
#[async_trait::async_trait]
pub trait Incoming: Send {
    /// The request's header.
    fn header(&self) -> &RequestHeader;
    /// The TCP peer.
    fn peer(&self) -> Option<IpAddr>;
    /// The whole body, read once (within the route's size and deadline) on first ask.
    async fn body(&mut self) -> Result<bytes::Bytes, BadRequest>;
}

/// A request already read whole: its header, peer and body (tools and tests; the proxy reads
/// the session's body only when a gate asks for it).
pub struct Buffered {
    pub header: RequestHeader,
    pub peer: Option<IpAddr>,
    pub body: bytes::Bytes,
}

#[async_trait::async_trait]
impl Incoming for Buffered {
    fn header(&self) -> &RequestHeader {
        &self.header
    }

    fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    async fn body(&mut self) -> Result<bytes::Bytes, BadRequest> {
        Ok(self.body.clone())
    }
}

/// Where a purchase was asked: its sale route, the activity segment of its path, its target
/// (normalised) and its canonical form (what an admitted request is forwarded as).
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    pub route: &'a SaleRoute,
    pub activity: &'a str,
    pub target: &'a Target,
    pub canonical: (&'a http::Method, &'a http::Uri),
}

/// Why a new purchase is held back while a reservation its `Idempotency-Key` already won is
/// still handed out (the reserve then runs replay only, and this is the answer if the key won
/// nothing).
#[derive(Debug)]
pub enum HeldBack {
    /// Outside the sale's hours.
    Hours(Decision),
    /// By the waiting room: its refusal, or the buyer's place (`Some` reply) to give instead.
    Queue(Decision, Option<Box<Reply>>),
    /// By a fleet-wide halt (no ticket is given meanwhile either).
    Halted,
}

impl HeldBack {
    /// The answer when the key won nothing.
    fn verdict(self) -> Verdict {
        match self {
            HeldBack::Queue(_, Some(reply)) => Verdict::Queue(reply),
            HeldBack::Hours(decision) | HeldBack::Queue(decision, None) => {
                Verdict::Refuse(decision)
            }
            HeldBack::Halted => Verdict::Refuse(Decision::Halted),
        }
    }
}

/// One purchase on its way through the gates: what the request asks, and what the gates
/// learned so far. Gates after [`gates::identity::Identity`] read who buys what.
pub struct Attempt<'a> {
    pub asked: Asked<'a>,
    pub incoming: &'a mut dyn Incoming,
    /// Who, what, how many, what is left: written by the gates, read by the answer and the log.
    pub facts: SaleFacts,
    /// The `Idempotency-Key`, if sent.
    pub key: Option<String>,
    /// Set when a new purchase is refused but the key's reservation may still be answered.
    pub held_back: Option<HeldBack>,
    /// The time the sale's hours are judged by (the store's clock as last read), read once.
    pub now: DateTime<Utc>,
    /// The id the reserve takes: made for the buyer's home segment unless set (the model test
    /// replays a reserve whose abandon landed first, with its id).
    pub reservation_id: Option<String>,
    /// The buyer's verified token's claims (none for an identity header); set by the identity
    /// gate, read by the phase gate.
    pub claims: crate::client_policy::identity::Claims,
    /// On an activity sold in phases, the buyer's steps through them; set by the phase gate.
    pub steps: Option<crate::stock::Steps>,
}

impl Attempt<'_> {
    /// The activity bought; set by the identity gate, which every gate that reads it follows.
    pub fn activity(&self) -> &Arc<Activity> {
        self.facts
            .activity
            .as_ref()
            .expect("the identity gate names the activity first")
    }

    /// The buyer; set by the identity gate.
    pub fn user(&self) -> &str {
        self.facts
            .user
            .as_deref()
            .expect("the identity gate names the buyer first")
    }

    /// The quantity; set by the quantity gate.
    pub fn qty(&self) -> u32 {
        self.facts
            .qty
            .expect("the quantity gate reads the quantity first")
    }
}

/// The pipeline's answer to a purchase.
#[derive(Debug)]
pub enum Verdict {
    /// Refused with this decision.
    Refuse(Decision),
    /// Not the buyer's turn: their place in the waiting room (202 `queued`).
    Queue(Box<Reply>),
    /// Stock is held: forward with the signed reservation, or release.
    Reserved(Reservation),
    /// The store is down and the activity passes through: forward unreserved, marked.
    Passthrough,
}

/// A gate's answer: go on to the next gate, or this verdict.
#[derive(Debug)]
pub enum Step {
    Pass,
    Answer(Verdict),
}

impl Step {
    pub fn refuse(decision: Decision) -> Step {
        Step::Answer(Verdict::Refuse(decision))
    }
}

impl From<Result<(), Decision>> for Step {
    fn from(result: Result<(), Decision>) -> Step {
        match result {
            Ok(()) => Step::Pass,
            Err(decision) => Step::refuse(decision),
        }
    }
}

/// What the gates share: the request's configuration generation, the checkout (the way to the
/// stock, the sale state read, the buckets, the breaker), and the waiting rooms.
#[derive(Clone, Copy)]
pub struct Parts<'a> {
    pub rules: Rules<'a>,
    pub checkout: &'a Checkout,
    pub room: &'a dyn Room,
}

/// One step of the pipeline. `check` may answer, or change the attempt and let it go on.
///
/// Gates are called by their type, never through `dyn` ([`gates::run`]): the pipeline is one
/// future, with no allocation per gate.
pub trait Gate: Sync {
    fn check(
        &self,
        parts: Parts<'_>,
        attempt: &mut Attempt<'_>,
    ) -> impl std::future::Future<Output = Step> + Send;

    /// The gate's name (its type's), for the order's test and traces.
    fn name(&self) -> &'static str {
        let path = std::any::type_name::<Self>();
        path.rsplit("::").next().unwrap_or(path)
    }
}

/// Runs a purchase through every gate in order; the first answer is the verdict.
pub async fn run(parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Verdict {
    gates::run(parts, attempt).await.unwrap_or_else(|| {
        // The reserve gate, last, always answers.
        debug_assert!(false, "no gate answered");
        Verdict::Refuse(Decision::Unavailable)
    })
}

impl<'a> Attempt<'a> {
    /// A purchase not yet looked at; `now` is the time its hours are judged by.
    pub fn new(asked: Asked<'a>, incoming: &'a mut dyn Incoming, now: DateTime<Utc>) -> Self {
        Attempt {
            asked,
            incoming,
            facts: SaleFacts::default(),
            key: None,
            held_back: None,
            now,
            reservation_id: None,
            claims: Default::default(),
            steps: None,
        }
    }
}
