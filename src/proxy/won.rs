//! A purchase that won, as a browser sees it: the waiting room learns the buyer bought (their
//! polls say `bought`), and a browser buying from the waiting page is sent to the sale's
//! `success_url` (303, `{jti}` filled in), or shown what it won, instead of the backend's
//! answer. Runs once the reservation is settled: nothing here touches it.

use super::{respond, FlashProxy, RequestCtx};
use crate::purchase::presented;
use crate::waiting::page::{Landing, Queued};
use crate::waiting::ticket;
use crate::waiting::view::Status;
use crate::waiting::Answer;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use pingora::http::ResponseHeader;
use pingora::prelude::*;

impl FlashProxy {
    /// After a 2xx from the backend for a purchase holding stock; `true` when the buyer was
    /// answered here (the backend's answer is then not relayed).
    ///
    /// "From the waiting page" is read as: a client preferring a page, presenting a valid ticket
    /// of its own for this sale, on an activity with a waiting room (the page's own purchase is
    /// all of these); any other buyer gets the backend's answer.
    ///
    /// The backend's `Set-Cookie` headers (its session, the order it made) go with the
    /// gateway's answer; nothing else of the backend's answer does.
    pub(super) async fn won(
        &self,
        session: &mut Session,
        ctx: &RequestCtx,
        backend: &ResponseHeader,
    ) -> bool {
        self.tell_room_bought(ctx).await;
        let (Some(facts), Some(reservation)) = (&ctx.sale, &ctx.reservation) else {
            return false;
        };
        let (Some(activity), Some(user)) = (&facts.activity, &facts.user) else {
            return false;
        };
        if !ctx.client.html || activity.queue.is_none() {
            return false;
        }
        // Only a ticket the gateway signed for this buyer and sale is written back (header,
        // cookie, page): a replay is let through whatever ticket it shows.
        let key = &ctx.generation.settings.signing.ticket_key;
        let Some(ticket) = presented(&session.req_header().headers)
            .filter(|t| ticket::verify(key, &activity.id, user, &t.ticket).is_ok())
        else {
            return false;
        };
        let cookies: Vec<_> = backend
            .headers
            .get_all(http::header::SET_COOKIE)
            .iter()
            .cloned()
            .collect();
        let sale = ctx.generation.sale_page(&activity.id);
        let written = match &sale.page.success_url {
            Some(url) => {
                let location = url.replace("{jti}", &jti_in_url(&reservation.id));
                respond::see_other(session, &location, &reservation.id, &cookies).await
            }
            None => {
                let queued = Queued {
                    answer: Answer {
                        variants: Vec::new(),
                        ticket: ticket.ticket,
                        status: Status::Bought,
                        turn_left_ms: None,
                        challenge: None,
                        draw: None,
                        // By Redis's clock, as every ticket's cookie.
                        cookie_max_age_secs: self.gw.waiting.until_the_end_secs(activity),
                        ticket_replaced: false,
                    },
                    landing: Landing::Url(ctx.generation.settings.pages.shop_url.clone()),
                };
                let status = http::StatusCode::OK;
                let how = ctx.answering();
                let won = respond::Won {
                    reservation: &reservation.id,
                    cookies: &cookies,
                };
                respond::queue(session, &how, status, &queued, Some(won)).await
            }
        };
        if let Err(e) = written {
            tracing::debug!(error = %e, "the buyer left before hearing they won");
        }
        true
    }
}

impl FlashProxy {
    /// The waiting room learns the buyer bought (their polls say `bought`, and their place
    /// leaves the active set): after a 2xx for a purchase holding stock, whoever relays it.
    pub(super) async fn tell_room_bought(&self, ctx: &RequestCtx) {
        let Some(facts) = ctx.sale.as_ref().filter(|_| ctx.reservation.is_some()) else {
            return;
        };
        if let (Some(activity), Some(user)) = (&facts.activity, &facts.user) {
            self.gw.waiting.bought(activity, user).await;
        }
    }
}

/// A reservation id as it goes into a URL (percent-encoded but for `-`, `_`, `.`).
fn jti_in_url(jti: &str) -> String {
    const KEEP: &percent_encoding::AsciiSet =
        &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');
    utf8_percent_encode(jti, KEEP).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reservation_id_cannot_break_out_of_its_url() {
        assert_eq!(super::jti_in_url("0f3a-b_c.d"), "0f3a-b_c.d");
        assert_eq!(super::jti_in_url("a/b?c#d"), "a%2Fb%3Fc%23d");
    }
}
