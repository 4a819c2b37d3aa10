//! What the proxy reads from a sale request before admission takes stock: its size against the
//! limits, its whole body (within a deadline), and the canonical target it is forwarded as.

use crate::config::{SaleRoute, ServerSettings};
use crate::decision::BadRequest;
use pingora::http::RequestHeader;
use pingora::proxy::Session;

/// Why a body was not read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyError {
    TooLarge,
    TooSlow,
    Malformed,
    /// The gateway's budget for buffered bodies is spent: the client is asked to retry.
    Busy,
}

impl BodyError {
    /// What a buyer on a sale route is told.
    pub(super) fn bad_request(self) -> BadRequest {
        match self {
            BodyError::TooLarge => BadRequest::BodyTooLarge,
            BodyError::TooSlow => BadRequest::BodyTooSlow,
            BodyError::Malformed | BodyError::Busy => BadRequest::MalformedBody,
        }
    }
}

/// Kibibytes of buffered bodies held, taken from the generation's budget as the body arrives
/// and given back when the request ends.
pub(super) type Held = Option<tokio::sync::OwnedSemaphorePermit>;

/// Reads a request's whole body, within `deadline` and `limit` bytes (a sale request's also into
/// Pingora's retry buffer, `retry_buffer`, from which a purchase forwarded unreserved is sent),
/// and, with a `budget`, holding a kibibyte of it per kibibyte read (none left: `Busy`).
/// Answers `100 Continue` to a client that waits for it.
pub(super) async fn read_body(
    session: &mut Session,
    limit: u64,
    deadline: std::time::Duration,
    retry_buffer: bool,
    budget: Option<&std::sync::Arc<tokio::sync::Semaphore>>,
    held: &mut Held,
) -> std::result::Result<Vec<u8>, BodyError> {
    if session.as_mut().is_body_empty() {
        return Ok(Vec::new());
    }
    if retry_buffer {
        session.as_mut().enable_retry_buffering();
    }
    let read = async {
        let expects_continue = session
            .req_header()
            .headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if expects_continue {
            session
                .as_mut()
                .write_continue_response()
                .await
                .map_err(|_| BodyError::Malformed)?;
        }
        let mut body = Vec::new();
        while let Some(chunk) = session
            .read_request_body()
            .await
            .map_err(|_| BodyError::Malformed)?
        {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(BodyError::TooLarge);
            }
            if let Some(budget) = budget {
                let kib = (body.len() + chunk.len()).div_ceil(1024) - body.len().div_ceil(1024);
                if kib > 0 {
                    let more = budget
                        .clone()
                        .try_acquire_many_owned(kib as u32)
                        .map_err(|_| BodyError::Busy)?;
                    match held {
                        Some(h) => h.merge(more),
                        None => *held = Some(more),
                    }
                }
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(BodyError::TooSlow))
}

/// The URI an admitted request is forwarded with: the route's path for the activity (and the
/// variant its path names), and the query as sent. `None` if the query cannot be part of a URI.
pub(super) fn canonical_uri(
    route: &SaleRoute,
    activity: &str,
    variant: Option<&str>,
    query: Option<&str>,
) -> Option<http::Uri> {
    // Built at its exact length and handed to the `Uri` whole (one allocation, no copy).
    let query_len = query.map_or(0, |q| 1 + q.len());
    let mut target = String::with_capacity(route.path_len(activity, variant) + query_len);
    route.push_path(activity, variant, &mut target);
    if let Some(q) = query {
        target.push('?');
        target.push_str(q);
    }
    http::Uri::try_from(target).ok()
}

/// Whether a sale request is too large to consider: its headers, or its declared body (a
/// malformed Content-Length counts as too large). Chunked bodies are counted as they stream.
pub(super) fn oversized(req: &RequestHeader, limits: &ServerSettings) -> Option<BadRequest> {
    let header_bytes: u64 = req
        .headers
        .iter()
        .map(|(k, v)| (k.as_str().len() + v.len()) as u64)
        .sum();
    if header_bytes > limits.max_sale_header_bytes {
        return Some(BadRequest::HeadersTooLarge);
    }
    let length = req.headers.get(http::header::CONTENT_LENGTH)?;
    let length = length
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    (length > limits.max_sale_body_bytes).then_some(BadRequest::BodyTooLarge)
}
