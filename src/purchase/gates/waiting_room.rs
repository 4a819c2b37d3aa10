//! The waiting room in front of a purchase: a buyer whose turn it is goes on; one without it
//! gets a ticket and their place (202 `queued`) instead. A buyer with an `Idempotency-Key` the
//! room holds back still goes on, replay only: the reserve script answers the key's reservation
//! if it won one (a buyer retrying a purchase they made at their turn), else the room's answer
//! is given.

use crate::config::{Activity, Settings};
use crate::decision::Decision;
use crate::header_names::{cookie, QUEUE_SOLUTION, QUEUE_TICKET};
use crate::purchase::{Attempt, Gate, HeldBack, Parts, Step, Verdict};
use crate::waiting::page::{self, Landing, TICKET_COOKIE};
use crate::waiting::{self, Presented};
use http::HeaderMap;

/// The waiting rooms, as the gate asks them (the gateway's [`waiting::WaitingRoom`]; unit
/// tests use a fake).
#[async_trait::async_trait]
pub trait Room: Sync {
    /// The gate in front of a purchase by `user` presenting `presented` (a ticket) or
    /// `solution` (a proof of work for one), if anything.
    async fn gate(
        &self,
        settings: &Settings,
        activity: &Activity,
        user: &str,
        presented: Option<&Presented>,
        solution: Option<&str>,
    ) -> waiting::Turn;
}

#[async_trait::async_trait]
impl Room for waiting::WaitingRoom {
    async fn gate(
        &self,
        settings: &Settings,
        activity: &Activity,
        user: &str,
        presented: Option<&Presented>,
        solution: Option<&str>,
    ) -> waiting::Turn {
        waiting::WaitingRoom::gate(self, settings, activity, user, presented, solution).await
    }
}

/// No waiting rooms: every purchase passes (tools and tests whose activities have no queue).
pub struct NoQueues;

#[async_trait::async_trait]
impl Room for NoQueues {
    async fn gate(
        &self,
        _settings: &Settings,
        _activity: &Activity,
        _user: &str,
        _presented: Option<&Presented>,
        _solution: Option<&str>,
    ) -> waiting::Turn {
        waiting::Turn::Pass
    }
}

/// The proof-of-work solution a request sends (`X-Flashgate-Solution`), if any.
pub fn solution(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(QUEUE_SOLUTION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The ticket a request presents: the `X-Flashgate-Ticket` header, else the cookie (an empty
/// header does not hide the cookie).
pub fn presented(headers: &HeaderMap) -> Option<Presented> {
    let non_empty = |t: &str| Some(t.trim().to_owned()).filter(|t| !t.is_empty());
    if let Some(t) = headers
        .get(QUEUE_TICKET)
        .and_then(|v| v.to_str().ok())
        .and_then(non_empty)
    {
        return Some(Presented {
            ticket: t,
            from_cookie: false,
        });
    }
    cookie(headers, TICKET_COOKIE)
        .and_then(non_empty)
        .map(|ticket| Presented {
            ticket,
            from_cookie: true,
        })
}

pub struct WaitingTurn;

impl Gate for WaitingTurn {
    async fn check(&self, parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Step {
        if matches!(attempt.held_back, Some(HeldBack::Halted)) {
            // Replay only: a halt gives no ticket (see `super::halt`).
            return Step::Pass;
        }
        let activity = attempt.activity().clone();
        let Some(queue) = activity.queue.as_ref() else {
            return Step::Pass;
        };
        let headers = &attempt.incoming.header().headers;
        let ticket = presented(headers);
        let settings = parts.rules.settings;
        if let Some(t) = &ticket {
            // A buyer of the lane's second-chance line: the line says whose turn it is (the
            // reserve sells to them only while a unit is held for them), not the queue.
            let key = &settings.signing.ticket_key;
            if activity.second_chance.is_some()
                && waiting::line::holds_ticket(key, &activity.lane, attempt.user(), &t.ticket)
            {
                return Step::Pass;
            }
        }
        let keyed = attempt.key.is_some();
        match parts
            .room
            .gate(
                settings,
                &activity,
                attempt.user(),
                ticket.as_ref(),
                solution(headers),
            )
            .await
        {
            waiting::Turn::Pass => Step::Pass,
            waiting::Turn::Refuse(decision) if keyed && decision != Decision::Unavailable => {
                attempt.held_back = Some(HeldBack::Queue(decision, None));
                Step::Pass
            }
            waiting::Turn::Refuse(decision) => Step::refuse(decision),
            waiting::Turn::Wait(answer) => {
                let (method, target) = attempt.asked.canonical;
                let landing = match &queue.landing_url {
                    Some(url) => Landing::Url(url.clone()),
                    None => Landing::Purchase {
                        method: method.to_string(),
                        target: page::purchase_target(
                            attempt.asked.route,
                            attempt.activity(),
                            &target.to_string(),
                        ),
                    },
                };
                let reply = Box::new(page::Queued { answer, landing });
                if keyed {
                    attempt.held_back = Some(HeldBack::Queue(Decision::Waiting, Some(reply)));
                    return Step::Pass;
                }
                Step::Answer(Verdict::Queue(reply))
            }
        }
    }
}
