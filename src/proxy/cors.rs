//! CORS on the routes the gateway answers for (sale routes and `/flashgate/queue/*`): a
//! preflight there is answered here and never forwarded, and every answer on them, the
//! gateway's own and the backend's relayed, carries the allow headers for a listed origin
//! (`server.cors.allowed_origins`) and none for any other. The gateway alone speaks CORS on
//! these routes: a backend's own `Access-Control-*` headers there are dropped (by the module,
//! and by the relay of a sale route's answer when the module is not installed).
//!
//! The answers are decorated by a downstream module ([`CorsModule`]): every response header
//! the gateway writes through the session passes it, whichever phase wrote it. The request
//! marks itself as on such a route in `request_filter`. The module is installed only when the
//! configuration the gateway starts with lists origins (it costs every request two
//! allocations): listing the first origins takes a restart (a reload says so); changing the
//! list is live. Preflights are answered either way, and allow an origin only while the
//! module is there to decorate the answers: until that restart, origins a reload listed are
//! allowed by neither (a browser would pass the preflight, then fail on the answer).
//!
//! Approximation: answers written with Pingora's bare `respond_error` (a broken request before
//! routing, a failed pass-through of a purchase forwarded unreserved while the store is down)
//! carry no CORS headers; a browser reads them as a network error, which its app retries.

use super::waiting::poll_activity;
use crate::config::{IdentitySource, Settings};
use crate::edge::route::match_path;
use crate::edge::target::Target;
use async_trait::async_trait;
use http::header::{self, HeaderValue};
use http::Method;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::{HttpModule, HttpModuleBuilder, HttpModules, Module};
use pingora::prelude::*;
use std::any::Any;

/// Response headers a listed origin's script may read besides the safelisted ones.
const EXPOSED: &str = "X-Flashgate-Ticket, Retry-After";
/// Request headers a buyer's app sends (the identity header or `Authorization` is added).
const REQUEST_HEADERS: &str =
    "Content-Type, Idempotency-Key, X-Flashgate-Ticket, X-Flashgate-Solution";
/// How long a browser may keep a preflight's answer (seconds).
const MAX_AGE_SECS: &str = "600";

/// Adds the module that decorates answers on the gateway's routes.
pub(super) fn install(modules: &mut HttpModules) {
    modules.add_module(Box::new(CorsModule));
}

struct CorsModule;

impl HttpModuleBuilder for CorsModule {
    fn init(&self) -> Module {
        Box::new(CorsCtx::default())
    }
}

/// Per request: `None` off the gateway's routes (nothing changes), `Some(None)` on one for an
/// origin that is not allowed (or no origin), `Some(Some(origin))` for a listed one.
#[derive(Default)]
struct CorsCtx {
    route: Option<Option<HeaderValue>>,
}

#[async_trait]
impl HttpModule for CorsCtx {
    async fn response_header_filter(
        &mut self,
        resp: &mut ResponseHeader,
        _end_of_stream: bool,
    ) -> Result<()> {
        match &self.route {
            Some(origin) => decorate(resp, origin.as_ref()),
            None => Ok(()),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The allowed origin a request comes from, as its answer names it; `None` for any other
/// origin, or one that cannot be read.
fn allowed_origin(settings: &Settings, req: &RequestHeader) -> Option<HeaderValue> {
    let origin = req.headers.get(header::ORIGIN)?.to_str().ok()?;
    let origin = settings.server.cors.allowed(origin)?;
    HeaderValue::from_str(&origin).ok()
}

/// Marks the request as on one of the gateway's routes: its answer, whoever writes it, gets
/// the CORS headers its origin is due.
pub(super) fn mark(session: &mut Session, settings: &Settings) {
    let origin = allowed_origin(settings, session.req_header());
    if let Some(ctx) = session.downstream_modules_ctx.get_mut::<CorsCtx>() {
        ctx.route = Some(origin);
    }
}

/// Removes a backend's own `Access-Control-*` headers from its answer on a sale route, whether
/// or not the module is installed (no origin listed: none is allowed, whatever the backend says).
pub(super) fn drop_backends(resp: &mut ResponseHeader) {
    let foreign: Vec<header::HeaderName> = resp
        .headers
        .keys()
        .filter(|name| name.as_str().starts_with("access-control-"))
        .cloned()
        .collect();
    for name in foreign {
        resp.remove_header(&name);
    }
}

/// The answer-side headers: `Vary: Origin` always, the allow headers for a listed origin only.
fn decorate(resp: &mut ResponseHeader, origin: Option<&HeaderValue>) -> Result<()> {
    drop_backends(resp);
    resp.append_header(header::VARY, "Origin")?;
    if let Some(origin) = origin {
        resp.insert_header(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone())?;
        resp.insert_header(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, "true")?;
        resp.insert_header(header::ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED)?;
    }
    Ok(())
}

/// A CORS preflight on one of the gateway's routes: the methods the route takes and the
/// listed origin it comes from, if it is one.
pub(super) struct Preflight {
    methods: Vec<Method>,
    origin: Option<HeaderValue>,
}

/// The request as a preflight on a sale route or the waiting room (`OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`); `None` for anything else, which goes on as before.
pub(super) fn preflight(
    settings: &Settings,
    req: &RequestHeader,
    target: &Target,
) -> Option<Preflight> {
    if target.method != Method::OPTIONS
        || !req.headers.contains_key(header::ORIGIN)
        || !req
            .headers
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        return None;
    }
    let mut methods: Vec<Method> = settings
        .sale_routes
        .iter()
        .filter(|route| match_path(route, target).is_some())
        .map(|route| route.method().clone())
        .collect();
    let as_poll = Target {
        method: Method::GET,
        ..target.clone()
    };
    if poll_activity(&as_poll).is_some() {
        methods.push(Method::GET);
    }
    if methods.is_empty() {
        return None;
    }
    Some(Preflight {
        methods,
        origin: allowed_origin(settings, req),
    })
}

/// Answers a preflight (204): the allow headers for a listed origin, none for another, nor
/// for any while the answers cannot carry them (the module not installed: no origin was
/// listed at start-up).
pub(super) async fn answer(
    session: &mut Session,
    settings: &Settings,
    preflight: Preflight,
) -> Result<()> {
    let answers_decorated = session.downstream_modules_ctx.get::<CorsCtx>().is_some();
    let origin = preflight.origin.filter(|_| answers_decorated);
    let mut resp = ResponseHeader::build(204, Some(8))?;
    resp.insert_header(header::CONTENT_LENGTH, "0")?;
    decorate(&mut resp, origin.as_ref())?;
    if origin.is_some() {
        let methods: Vec<&str> = preflight.methods.iter().map(Method::as_str).collect();
        resp.insert_header(header::ACCESS_CONTROL_ALLOW_METHODS, methods.join(", "))?;
        let identity = match &settings.identity.source {
            IdentitySource::Header(name) => name.as_str(),
            IdentitySource::Jwt(_) => "Authorization",
        };
        resp.insert_header(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            format!("{REQUEST_HEADERS}, {identity}"),
        )?;
        resp.insert_header(header::ACCESS_CONTROL_MAX_AGE, MAX_AGE_SECS)?;
    }
    session.write_response_header(Box::new(resp), true).await
}
