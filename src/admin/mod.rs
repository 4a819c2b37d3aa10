//! The admin listener: `/metrics`, `/healthz`, `/readyz` open; `/v1/*` behind the bearer token.

mod console;
mod halt;
mod phases;
mod queue;
mod restock;
mod variants;
mod view;

use crate::config::{Activity, AdminToken};
use crate::lifecycle::AdminOutcome;
use crate::lifecycle::Lifecycle;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::reload::Reloader;
use crate::shutdown::Drain;
use crate::stock::breaker::Breaker;
use crate::stock::breaker::BreakerMode;
use crate::stock::StockStore;
use crate::waiting::WaitingRoom;
use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::{json, Value};
use std::sync::Arc;
use view::reservation_view;

pub struct AdminApp {
    gw: AdminParts,
    /// `None` when the gateway was not started from a file (nothing to reload from).
    reloader: Option<Arc<Reloader>>,
}

/// What the admin listener works with, handed over by the composition root (`crate::gateway`).
pub struct AdminParts {
    pub live: Live,
    pub metrics: Arc<Metrics>,
    pub store: Arc<StockStore>,
    pub lifecycle: Arc<Lifecycle>,
    pub waiting: Arc<WaitingRoom>,
    /// The store breaker (its admin switch).
    pub breaker: Arc<Breaker>,
    /// Readiness fails once shutdown began.
    pub drain: Arc<Drain>,
    /// The fleet's gateways as Redis last listed them (`GET /v1/fleet`).
    pub roster: Arc<crate::fleet::Roster>,
}

impl AdminParts {
    /// The current settings.
    fn settings(&self) -> Arc<crate::config::Settings> {
        self.live.settings()
    }

    /// Updates gauges that are cheap to read on demand (at scrape time).
    fn refresh_gauges(&self) {
        let buckets = self.live.current().policy.buckets();
        self.metrics.rate_limiter_keys.set(buckets as i64);
    }
}

impl AdminApp {
    pub fn new(parts: AdminParts, reloader: Option<Arc<Reloader>>) -> Self {
        AdminApp {
            gw: parts,
            reloader,
        }
    }

    /// `GET /v1/breaker`: the store breaker's state and the admin switch.
    fn breaker_view(&self) -> Response<Vec<u8>> {
        let (state, mode) = self.gw.breaker.status(&self.gw.settings().breaker);
        json_response(
            StatusCode::OK,
            &json!({"state": state.as_str(), "mode": mode.as_str()}),
        )
    }

    /// `POST /v1/config/reload`: 200 with the generation, or 422 naming the refused key.
    async fn reload(&self) -> Response<Vec<u8>> {
        let Some(reloader) = &self.reloader else {
            return error(
                StatusCode::CONFLICT,
                "no_config_file",
                "this gateway was not started from a configuration file",
            );
        };
        match reloader.reload().await {
            Ok(applied) => json_response(
                StatusCode::OK,
                &json!({
                    "result": "applied",
                    "generation": applied.generation,
                    "needs_restart": applied.needs_restart,
                    "warnings": applied.warnings,
                }),
            ),
            Err(e) => json_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                &json!({
                    "result": "refused",
                    "code": "invalid_config",
                    "message": e.to_string(),
                    "generation": self.gw.live.current().number,
                }),
            ),
        }
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    /// Every call that changes something (not a GET) is logged once, with its answer and who
    /// made it: the peer's address, `console` when the operator's console sent it (its own
    /// `X-Flashgate-Client` header), and the name the operator gave (`X-Flashgate-Operator`).
    /// Approximation: the token is one for all operators, so the name is what the caller says,
    /// a label for the log and not a proof; the address is the only fact.
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let (method, path) = (req.method.clone(), req.uri.path().to_owned());
        let via = match req.headers.get("x-flashgate-client").map(|v| v.as_bytes()) {
            Some(b"console") => "console",
            _ => "api",
        };
        let operator = operator_of(&req.headers);
        let answer = self.answer(session).await;
        if method != Method::GET && method != Method::HEAD {
            let peer = session
                .client_addr()
                .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
            tracing::info!(
                target: "flashgate::admin",
                %method,
                path,
                status = answer.status().as_u16(),
                peer,
                via,
                operator,
                "admin call"
            );
        }
        answer
    }
}

/// The longest operator name logged (characters).
const OPERATOR_MAX_CHARS: usize = 64;

/// The operator's name as `X-Flashgate-Operator` gives it (UTF-8, percent-encoded by the
/// console): "-" when none is given, "invalid" when it is not a name of at most
/// [`OPERATOR_MAX_CHARS`] characters: letters and digits of any script, spaces and `.-_@'()`
/// only, so a log line (text or JSON) never carries a control, format or separator character
/// (no line break, no right-to-left override, nothing invisible).
fn operator_of(headers: &http::HeaderMap) -> String {
    let Some(raw) = headers.get("x-flashgate-operator") else {
        return "-".to_owned();
    };
    let decoded = raw
        .to_str()
        .ok()
        .and_then(|v| percent_encoding::percent_decode_str(v).decode_utf8().ok())
        .map(|v| v.trim_matches(' ').to_owned());
    match decoded {
        Some(name)
            if !name.is_empty()
                && name.chars().count() <= OPERATOR_MAX_CHARS
                && name
                    .chars()
                    .all(|c| c.is_alphanumeric() || " .-_@'()".contains(c)) =>
        {
            name
        }
        _ => "invalid".to_owned(),
    }
}

impl AdminApp {
    /// The answer to one admin call.
    async fn answer(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_owned();
        let query = req.uri.query().map(str::to_owned);
        let settings = self.gw.settings();
        let authorized = bearer_matches(
            req.headers.get(http::header::AUTHORIZATION),
            settings.admin.token.as_ref(),
        );
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if let Some(page) = console::serve(&method, &segments, &req.headers) {
            return page;
        }
        if segments.first() != Some(&"v1") {
            return self.open(&method, &segments).await;
        }
        if !authorized {
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "bearer token missing or wrong",
            );
        }
        let activity = |id: &str| settings.activities.get(id);
        match (&method, &segments[1..]) {
            (&Method::POST, ["config", "reload"]) => self.reload().await,
            (&Method::GET, ["breaker"]) => self.breaker_view(),
            (&Method::GET, ["fleet"]) => json_response(
                StatusCode::OK,
                &self.gw.roster.view(self.gw.store.presence_id()),
            ),
            (&Method::POST, ["breaker", mode]) => self.breaker_switch(mode),
            (&Method::GET, ["activities"]) => {
                let mut list = Vec::with_capacity(settings.activities.len());
                for activity in settings.activities.iter() {
                    list.push(self.activity_view(activity).await);
                }
                json_response(StatusCode::OK, &json!({ "activities": list }))
            }
            (&Method::GET, ["activities", id]) => match activity(id) {
                Some(activity) => {
                    json_response(StatusCode::OK, &self.activity_view(activity).await)
                }
                None => unknown_activity(),
            },
            (&Method::POST, ["activities", act, "restock"]) => match activity(act) {
                Some(activity) => {
                    let activity = activity.clone();
                    self.restock(session, &activity).await
                }
                None => unknown_activity(),
            },
            (&Method::POST, ["activities", act, stop @ ("halt" | "resume")]) => {
                match activity(act) {
                    Some(activity) if *stop == "halt" => self.halt(activity).await,
                    Some(activity) => {
                        let activity = activity.clone();
                        self.resume(session, &activity).await
                    }
                    None => unknown_activity(),
                }
            }
            (method, ["activities", act, "queue", rest @ ..]) => match activity(act) {
                Some(activity) => {
                    queue::handle(&self.gw, activity, method, rest, query.as_deref()).await
                }
                None => unknown_activity(),
            },
            (method, ["activities", act, "reservations", id, rest @ ..]) => match activity(act) {
                Some(activity) => self.reservation_of(activity, id, method, rest).await,
                None => unknown_activity(),
            },
            _ => error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
        }
    }
}

/// 404 `unknown_activity`.
fn unknown_activity() -> Response<Vec<u8>> {
    error(
        StatusCode::NOT_FOUND,
        "unknown_activity",
        "no such activity",
    )
}

impl AdminApp {
    /// The endpoints open without a token: metrics, health, readiness, the JWKS.
    async fn open(&self, method: &Method, segments: &[&str]) -> Response<Vec<u8>> {
        match (method, segments) {
            (&Method::GET, ["metrics"]) => {
                self.gw.refresh_gauges();
                response(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    self.gw.metrics.encode(),
                )
            }
            (&Method::GET, ["healthz"]) => json_response(StatusCode::OK, &json!({"status": "ok"})),
            (&Method::GET, [".well-known", "jwks.json"]) => json_response(
                StatusCode::OK,
                &crate::reservation::Signer::jwks(&self.gw.settings().signing.published_keys),
            ),
            (&Method::GET, ["readyz"]) if self.gw.drain.is_draining() => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"ready": false, "reason": "shutting down"}),
            ),
            (&Method::GET, ["readyz"]) => match self.gw.store.ready().await {
                Ok(()) if !self.proxy_listening().await => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"ready": false, "reason": "the proxy is not listening yet"}),
                ),
                Ok(()) if !self.gw.lifecycle.state().halts_read() => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"ready": false, "reason": "the activities' halts are not read yet"}),
                ),
                Ok(()) if !self.gw.lifecycle.state().stock_made() => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"ready": false, "reason": "the stock is not prewarmed yet"}),
                ),
                Ok(()) if self.birth_holds().next().is_some() => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({
                        "ready": false,
                        "reason": "stock made after its sale opened waits 1.5 s before it \
                                   sells, so that a gateway that saw it sell can say the store \
                                   forgot it (in doubt, hold)",
                        "held": self.birth_holds().collect::<Vec<_>>(),
                    }),
                ),
                Ok(()) if self.settling_fences().next().is_some() => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({
                        "ready": false,
                        "reason": "the Redis master changed under these activities (a restart \
                                   or a failover): fenced while the gateways compare what it \
                                   holds; a rule lifts an ordinary restart's fence within \
                                   seconds (see flashgate_activity_fenced and the log)",
                        "fenced": self.settling_fences().collect::<Vec<_>>(),
                    }),
                ),
                Ok(()) => match self.refused_activities() {
                    refused if refused.is_empty() => {
                        json_response(StatusCode::OK, &json!({"ready": true}))
                    }
                    refused => json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &json!({
                            "ready": false,
                            "reason": "Redis refuses these activities as configured (its \
                                       record, or its eviction policy): see \
                                       flashgate_activity_refused and the log",
                            "refused": refused.iter().map(|(id, _)| id).collect::<Vec<_>>(),
                            "why": refused.into_iter().collect::<serde_json::Map<_, _>>(),
                        }),
                    ),
                },
                Err(e) => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"ready": false, "reason": e.to_string()}),
                ),
            },
            _ => error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
        }
    }

    /// The configured activities Redis's record refuses (an older version than one on sale, a
    /// changed segment count, a damaged segment): a gateway restarted with an old YAML is not
    /// ready, instead of answering every buyer `unavailable` while its load balancer sends more.
    /// Refusals are per stock lane: an activity with variants is named once, for its first
    /// refused variant.
    fn refused_activities(&self) -> Vec<(String, Value)> {
        let state = self.gw.lifecycle.state();
        let mut refused: Vec<(String, Value)> = Vec::new();
        for lane in self.gw.settings().activities.lanes() {
            if !state.is_refused(lane) || refused.iter().any(|(id, _)| *id == *lane.id) {
                continue;
            }
            let why = state.refusal(&lane.lane).map(|r| r.to_string());
            refused.push((lane.id.to_string(), json!(why)));
        }
        refused
    }

    /// The configured stock lanes on their birth hold (`lua/prewarm.lua`), by name; a sale
    /// that ended is left out (it sells nothing, and no check arms it any more).
    /// The stock lanes (of sales not ended) whose fence a rule may still lift
    /// ([`crate::stock::failover::Failover::fence_settling`]).
    fn settling_fences(&self) -> impl Iterator<Item = String> {
        self.open_lanes_where(|f, lane| f.fence_settling(lane))
    }

    /// The stock lanes (of sales not ended) on their birth hold.
    fn birth_holds(&self) -> impl Iterator<Item = String> {
        self.open_lanes_where(|f, lane| f.on_birth_hold(lane))
    }

    /// The stock lanes of sales not ended (by Redis's clock) for which `what` holds.
    fn open_lanes_where(
        &self,
        what: impl Fn(&crate::stock::failover::Failover, &str) -> bool,
    ) -> impl Iterator<Item = String> {
        let settings = self.gw.settings();
        let store = &self.gw.store;
        let now = store.clock().now();
        settings
            .activities
            .lanes()
            .filter(|lane| lane.window_at(now) != crate::config::SaleWindow::Ended)
            .filter(|lane| what(store.failover(), &lane.lane))
            .map(|lane| lane.lane.to_string())
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// Whether the proxy's listener takes connections: Pingora starts the services one after
    /// another, and the admin listener answers before the proxy's is bound, so without this a
    /// load balancer could send buyers to a port that refuses them. A connection to the listen
    /// address, closed at once (the proxy reads nothing from it).
    async fn proxy_listening(&self) -> bool {
        let listen = self.gw.settings().server.listen;
        let connect = tokio::net::TcpStream::connect(listen);
        matches!(
            tokio::time::timeout(std::time::Duration::from_millis(500), connect).await,
            Ok(Ok(_))
        )
    }

    /// `POST /v1/breaker/{auto,open,closed}`: the admin switch.
    fn breaker_switch(&self, mode: &str) -> Response<Vec<u8>> {
        let mode = match mode {
            "auto" => BreakerMode::Auto,
            "open" => BreakerMode::ForcedOpen,
            "closed" => BreakerMode::ForcedClosed,
            _ => {
                return error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "breaker modes: auto, open, closed",
                )
            }
        };
        self.gw.breaker.set_mode(mode);
        self.breaker_view()
    }

    /// `/v1/activities/{act}/reservations/{id}`: `GET` the record, `POST …/confirm`,
    /// `POST …/release`.
    async fn reservation(
        &self,
        activity: &Activity,
        id: &str,
        method: &Method,
        rest: &[&str],
    ) -> Response<Vec<u8>> {
        let lifecycle = &self.gw.lifecycle;
        let outcome = match (method, rest) {
            (&Method::GET, []) => lifecycle
                .lookup(activity, id)
                .await
                .map(|r| r.map_or(AdminOutcome::NotFound, AdminOutcome::Done)),
            (&Method::POST, ["confirm"]) => lifecycle.confirm_by_id(activity, id).await,
            (&Method::POST, ["release"]) => lifecycle.release_by_id(activity, id).await,
            _ => return error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
        };
        match outcome {
            Ok(AdminOutcome::Done(record)) => {
                json_response(StatusCode::OK, &reservation_view(activity, id, &record))
            }
            Ok(AdminOutcome::Conflict(record)) => {
                let mut body = reservation_view(activity, id, &record);
                body["code"] = json!("released");
                body["message"] = json!("the reservation was released; it cannot be confirmed");
                json_response(StatusCode::CONFLICT, &body)
            }
            Ok(AdminOutcome::NotFound) => error(
                StatusCode::NOT_FOUND,
                "unknown_reservation",
                "no such reservation",
            ),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &e.to_string(),
            ),
        }
    }
}

/// Compares the presented bearer token with the configured one in time independent of where
/// they differ. With no token configured, nothing matches.
fn bearer_matches(header: Option<&http::HeaderValue>, token: Option<&AdminToken>) -> bool {
    let (Some(header), Some(token)) = (header, token) else {
        return false;
    };
    let Some(presented) = header.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    let expected = token.0.as_bytes();
    if presented.len() != expected.len() {
        return false;
    }
    presented
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

fn response(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .expect("static response parts")
}

fn json_response(status: StatusCode, body: &Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec(body).expect("JSON values serialize");
    response(status, "application/json", body)
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Vec<u8>> {
    json_response(status, &json!({"code": code, "message": message}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_comparison() {
        let token = AdminToken("s3cret".into());
        let h = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert!(bearer_matches(Some(&h("Bearer s3cret")), Some(&token)));
        assert!(!bearer_matches(Some(&h("Bearer s3cre")), Some(&token)));
        assert!(!bearer_matches(Some(&h("Bearer s3cret2")), Some(&token)));
        assert!(!bearer_matches(Some(&h("s3cret")), Some(&token)));
        assert!(!bearer_matches(None, Some(&token)));
        assert!(!bearer_matches(Some(&h("Bearer s3cret")), None));
    }

    #[test]
    fn the_operators_name_is_printable_text_or_named_as_not() {
        let of = |v: Option<&str>| {
            let mut h = http::HeaderMap::new();
            if let Some(v) = v {
                h.insert(
                    "x-flashgate-operator",
                    http::HeaderValue::from_str(v).unwrap(),
                );
            }
            operator_of(&h)
        };
        assert_eq!(of(None), "-");
        assert_eq!(of(Some("ana")), "ana");
        assert_eq!(of(Some("Ana%20%E6%9D%8E")), "Ana 李");
        assert_eq!(of(Some("%0Aforged line")), "invalid");
        assert_eq!(of(Some("%FF")), "invalid");
        for hidden in [
            "%E2%80%AE",
            "%E2%80%A8",
            "%E2%80%8B",
            "%E2%81%A6",
            "%1B%5B31m",
            "%C2%85",
        ] {
            assert_eq!(of(Some(&format!("carol{hidden}x"))), "invalid", "{hidden}");
        }
        assert_eq!(of(Some("O'Brien%20(SRE)")), "O'Brien (SRE)");
        assert_eq!(of(Some("  ")), "invalid");
        assert_eq!(of(Some(&"a".repeat(65))), "invalid");
        assert_eq!(of(Some(&"a".repeat(64))), "a".repeat(64));
    }
}
