//! Answers the gateway writes itself.

use crate::admission::Decision;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::FailToProxy;

/// Writes the JSON answer for a decision: `{"code", "message"}`, plus `Retry-After` where the
/// contract asks for one.
pub async fn decision(session: &mut Session, decision: &Decision) -> Result<()> {
    let reply = decision.reply();
    let body = Bytes::from(reply.body());
    let mut resp = ResponseHeader::build(reply.status, Some(5))?;
    resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
    resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    if let Some(secs) = reply.retry_after_secs {
        resp.insert_header(http::header::RETRY_AFTER, secs.to_string())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

/// A JSON answer of the gateway's own (`{"code", "message"}`), never cached.
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

/// Writes a waiting-room answer: the ticket in its header and cookie, never cached.
pub async fn queue(session: &mut Session, reply: crate::waiting::page::Reply) -> Result<()> {
    let mut resp = ResponseHeader::build(reply.status, Some(6))?;
    resp.insert_header(http::header::CONTENT_TYPE, reply.content_type)?;
    resp.insert_header(http::header::CONTENT_LENGTH, reply.body.len().to_string())?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    // A challenge carries no ticket yet: neither header.
    if !reply.ticket.is_empty() {
        resp.insert_header(crate::header_names::QUEUE_TICKET, reply.ticket)?;
        resp.insert_header(http::header::SET_COOKIE, reply.cookie)?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(reply.body)), true)
        .await
}
