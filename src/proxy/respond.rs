//! Answers the gateway writes itself.

use crate::decision::Decision;
use crate::pages::{Client, Pages, Sale, Waiting};
use crate::waiting::page::{self, Queued};
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::FailToProxy;

/// How one request's answers are written: JSON or a page (read once from its `Accept`), in
/// which language, naming which sale.
pub struct Answering<'a> {
    pub client: Client,
    pub pages: &'a Pages,
    pub sale: Option<Sale<'a>>,
    /// The variant the purchase named, if it named one the activity sells.
    pub variant: Option<&'a str>,
    /// The address of the lane's second-chance line, offered with `sold_out`.
    pub line: Option<String>,
    /// The `Allow` header of a 405.
    pub allow: Option<&'a str>,
    /// The purchase as asked (a sale route's canonical method and target), for a page that
    /// sends it again at the opening.
    pub again: Option<crate::pages::Again<'a>>,
}

const HTML: &str = "text/html; charset=utf-8";
const JSON: &str = "application/json";

/// Writes the answer for a decision: `{"code", "message"}` or its page, with the same status,
/// plus `Retry-After` where the contract asks for one.
pub async fn decision(
    session: &mut Session,
    how: &Answering<'_>,
    decision: &Decision,
) -> Result<()> {
    let reply = decision.reply();
    let (content_type, body) = if how.client.html {
        let page = how.pages.refusal(
            how.client.lang,
            &reply,
            how.sale,
            how.again,
            how.line.as_deref(),
        );
        (HTML, Bytes::from(page))
    } else {
        let line = how.line.as_deref();
        (
            JSON,
            Bytes::from(reply.body(how.client.lang, how.variant, line)),
        )
    };
    let mut resp = ResponseHeader::build(reply.status, Some(9))?;
    own_answer(&mut resp, content_type, body.len())?;
    if content_type == HTML {
        page_headers(&mut resp, how.pages, &body)?;
    }
    if let Some(secs) = reply.retry_after_secs {
        resp.insert_header(http::header::RETRY_AFTER, secs.to_string())?;
    }
    if let Some(allow) = how.allow {
        resp.insert_header(http::header::ALLOW, allow)?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

/// The JSON answer for a decision as a whole HTTP/1.1 response, for the front to write in one
/// write (`crate::front`): the status, body and headers [`decision`] writes for a JSON client,
/// `Vary: Origin` when CORS is on (as the CORS module adds to every answer on the gateway's
/// routes), and `Connection: close` when the connection ends after it.
pub fn decision_bytes(
    lang: crate::catalogue::Lang,
    decision: &Decision,
    lane: Option<&crate::config::Activity>,
    cors_on: bool,
    close: bool,
) -> Vec<u8> {
    use std::io::Write;
    let reply = decision.reply();
    let variant = lane.and_then(|a| a.variant.as_deref());
    let line = lane.and_then(crate::waiting::line::join_url);
    let body = reply.body(lang, variant, line.as_deref());
    let head = OneWrite {
        status: reply.status,
        cors_on,
        close,
    };
    head.write(&body, |out| {
        if let Some(secs) = reply.retry_after_secs {
            // Writing to a Vec cannot fail.
            let _ = write!(out, "Retry-After: {secs}\r\n");
        }
    })
}

/// A waiting-room answer (202 `queued`, JSON) as a whole HTTP/1.1 response for the front to
/// write in one write: what [`queue`] writes for a JSON client (the ticket in its header and
/// cookie), with `Vary: Origin` and `Connection: close` as [`decision_bytes`] has them.
pub fn queued_bytes(
    lang: crate::catalogue::Lang,
    queued: &Queued,
    cors_on: bool,
    close: bool,
) -> Vec<u8> {
    let answer = &queued.answer;
    let body = page::json_bytes(answer, lang);
    let head = OneWrite {
        status: http::StatusCode::ACCEPTED,
        cors_on,
        close,
    };
    head.write(&body, |out| {
        // A challenge carries no ticket yet: neither header.
        if !answer.ticket.is_empty() {
            out.extend_from_slice(b"X-Flashgate-Ticket: ");
            out.extend_from_slice(answer.ticket.as_bytes());
            out.extend_from_slice(b"\r\nSet-Cookie: ");
            page::write_cookie(out, answer);
            out.extend_from_slice(b"\r\n");
        }
    })
}

/// The head of a JSON answer the front writes whole: status, type, length, never cached,
/// varying with what the client asked for, `Vary: Origin` when CORS is on (as the CORS module
/// adds to every answer on the gateway's routes), the date as Pingora's sessions write it (a
/// per-thread copy renewed once a second), `Connection: close` when the connection ends after.
struct OneWrite {
    status: http::StatusCode,
    cors_on: bool,
    close: bool,
}

impl OneWrite {
    /// The whole response: the head, `extra` headers, then `body`.
    fn write(&self, body: &[u8], extra: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        use std::io::Write;
        let mut out = Vec::with_capacity(320 + body.len());
        let reason = self.status.canonical_reason().unwrap_or("");
        // Writing to a Vec cannot fail.
        let _ = write!(
            out,
            "HTTP/1.1 {} {reason}\r\nContent-Type: {JSON}\r\nContent-Length: {}\r\n\
             Cache-Control: no-store\r\nVary: Accept, Accept-Language\r\n",
            self.status.as_u16(),
            body.len()
        );
        extra(&mut out);
        if self.cors_on {
            out.extend_from_slice(b"Vary: Origin\r\n");
        }
        out.extend_from_slice(b"Date: ");
        out.extend_from_slice(pingora::protocols::http::date::get_cached_date().as_bytes());
        out.extend_from_slice(b"\r\n");
        if self.close {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        out
    }
}

/// The headers of every answer the gateway writes for a sale route or the queue: its type and
/// length, never cached, and varying with what the client asked for.
/// A buyer page's security headers (see `crate::pages::headers`).
fn page_headers(resp: &mut ResponseHeader, pages: &Pages, body: &[u8]) -> Result<()> {
    for (name, value) in pages.headers_for(&String::from_utf8_lossy(body)) {
        resp.insert_header(name, value)?;
    }
    Ok(())
}

fn own_answer(resp: &mut ResponseHeader, content_type: &str, len: usize) -> Result<()> {
    resp.insert_header(http::header::CONTENT_TYPE, content_type)?;
    resp.insert_header(http::header::CONTENT_LENGTH, len.to_string())?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    resp.insert_header(http::header::VARY, "Accept, Accept-Language")
}

/// A JSON answer of the gateway's own (`{"code", "message"}`), never cached.
/// [`json`], setting a cookie (the second-chance line's ticket).
pub async fn json_with_cookie(
    session: &mut Session,
    status: u16,
    body: &serde_json::Value,
    cookie: &str,
) -> Result<()> {
    let body = Bytes::from(body.to_string());
    let mut resp = ResponseHeader::build(status, Some(5))?;
    resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
    resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    resp.insert_header(http::header::SET_COOKIE, cookie)?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

pub async fn json(session: &mut Session, status: u16, body: &serde_json::Value) -> Result<()> {
    let body = Bytes::from(body.to_string());
    let mut resp = ResponseHeader::build(status, Some(4))?;
    resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
    resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

/// A bare status answer on another route (no body), with `Retry-After` when given.
pub async fn status(
    session: &mut Session,
    status: u16,
    retry_after_secs: Option<u64>,
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(3))?;
    resp.insert_header(http::header::CONTENT_LENGTH, "0")?;
    if let Some(secs) = retry_after_secs {
        resp.insert_header(http::header::RETRY_AFTER, secs.to_string())?;
    }
    session.write_response_header(Box::new(resp), true).await
}

/// Pingora's usual answer to a failed pass-through request (502 for upstream trouble, 400 for a
/// broken request, nothing if the client is gone).
pub async fn proxy_error(session: &mut Session, e: &Error) -> FailToProxy {
    let code = match e.etype() {
        ErrorType::HTTPStatus(code) => *code,
        _ => match e.esource() {
            ErrorSource::Upstream => 502,
            ErrorSource::Downstream => match e.etype() {
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                _ => 400,
            },
            ErrorSource::Internal | ErrorSource::Unset => 500,
        },
    };
    if code > 0 {
        if let Err(err) = session.respond_error(code).await {
            tracing::debug!(error = %err, "could not send the error response");
        }
    }
    FailToProxy {
        error_code: code,
        can_reuse_downstream: false,
    }
}

/// A won purchase the gateway answers itself: its reservation, and the backend's cookies.
#[derive(Clone, Copy)]
pub struct Won<'a> {
    pub reservation: &'a str,
    pub cookies: &'a [http::HeaderValue],
}

/// Writes a waiting-room answer in `status` (JSON or the waiting page; `won`: the "bought"
/// page of a won purchase): the ticket in its header and cookie, never cached.
pub async fn queue(
    session: &mut Session,
    how: &Answering<'_>,
    status: http::StatusCode,
    queued: &Queued,
    won: Option<Won<'_>>,
) -> Result<()> {
    let reservation = won.map(|w| w.reservation);
    let answer = &queued.answer;
    let lang = how.client.lang;
    let (content_type, body) = match how.sale {
        // A challenge first (no ticket yet): its own page, which solves it and polls.
        Some(sale) if how.client.html && answer.challenge.is_some() => (
            HTML,
            page::challenge_page(&page::json(answer, lang), sale.id).into_bytes(),
        ),
        Some(sale) if how.client.html => {
            let page = Waiting {
                answer,
                sale,
                landing: &queued.landing,
                reservation,
            };
            (HTML, how.pages.waiting(lang, &page).into_bytes())
        }
        _ => (JSON, page::json_bytes(answer, lang)),
    };
    let mut resp = ResponseHeader::build(status, Some(10))?;
    own_answer(&mut resp, content_type, body.len())?;
    if content_type == HTML {
        page_headers(&mut resp, how.pages, &body)?;
    }
    // A challenge carries no ticket yet: neither header.
    if !answer.ticket.is_empty() {
        resp.insert_header(crate::header_names::QUEUE_TICKET, answer.ticket.as_str())?;
        resp.insert_header(http::header::SET_COOKIE, page::cookie(answer))?;
    }
    if let Some(won) = won {
        resp.insert_header(super::headers::RESERVATION_ID, won.reservation)?;
        for cookie in won.cookies {
            resp.append_header(http::header::SET_COOKIE, cookie)?;
        }
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
}

/// A won purchase's redirect (303) to the sale's `success_url`, with the reservation id and the
/// backend's cookies.
pub async fn see_other(
    session: &mut Session,
    location: &str,
    reservation: &str,
    cookies: &[http::HeaderValue],
) -> Result<()> {
    let mut resp = ResponseHeader::build(http::StatusCode::SEE_OTHER, Some(4))?;
    resp.insert_header(http::header::LOCATION, location)?;
    resp.insert_header(http::header::CONTENT_LENGTH, "0")?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    resp.insert_header(super::headers::RESERVATION_ID, reservation)?;
    for cookie in cookies {
        resp.append_header(http::header::SET_COOKIE, cookie)?;
    }
    session.write_response_header(Box::new(resp), true).await
}

/// A buyer who joined a second-chance line from its page: sent to the line's page (303, the
/// same address) with their ticket's cookie.
pub async fn joined_line(session: &mut Session, location: &str, cookie: &str) -> Result<()> {
    let mut resp = ResponseHeader::build(http::StatusCode::SEE_OTHER, Some(4))?;
    resp.insert_header(http::header::LOCATION, location)?;
    resp.insert_header(http::header::CONTENT_LENGTH, "0")?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    resp.insert_header(http::header::SET_COOKIE, cookie)?;
    session.write_response_header(Box::new(resp), true).await
}

/// The second-chance line's page, with the ticket's cookie.
pub async fn line_page(
    session: &mut Session,
    pages: &crate::pages::Pages,
    status: u16,
    html: String,
    cookie: &str,
) -> Result<()> {
    let body = Bytes::from(html);
    let mut resp = ResponseHeader::build(status, Some(8))?;
    own_answer(&mut resp, HTML, body.len())?;
    page_headers(&mut resp, pages, &body)?;
    resp.insert_header(http::header::SET_COOKIE, cookie)?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}
