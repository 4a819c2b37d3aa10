//! The admin listener: `/metrics`, `/healthz`, `/readyz` open; `/v1/*` behind the bearer token.

use crate::config::{Activity, AdminToken};
use crate::gateway::Gateway;
use async_trait::async_trait;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::{json, Value};
use std::sync::Arc;

pub struct AdminApp {
    gw: Arc<Gateway>,
}

impl AdminApp {
    pub fn new(gw: Arc<Gateway>) -> Self {
        AdminApp { gw }
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_owned();
        let authorized = bearer_matches(
            req.headers.get(http::header::AUTHORIZATION),
            self.gw.settings.admin.token.as_ref(),
        );
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        match (&method, segments.as_slice()) {
            (&Method::GET, ["metrics"]) => {
                self.gw.admission.refresh_gauges();
                response(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    self.gw.metrics.encode(),
                )
            }
            (&Method::GET, ["healthz"]) => json_response(StatusCode::OK, &json!({"status": "ok"})),
            (&Method::GET, ["readyz"]) => match self.gw.store.ready().await {
                Ok(()) => json_response(StatusCode::OK, &json!({"ready": true})),
                Err(e) => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"ready": false, "reason": e.to_string()}),
                ),
            },
            (_, ["v1", ..]) if !authorized => error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "bearer token missing or wrong",
            ),
            (&Method::GET, ["v1", "activities"]) => {
                let mut list = Vec::with_capacity(self.gw.settings.activities.len());
                for activity in self.gw.settings.activities.iter() {
                    list.push(self.activity_view(activity).await);
                }
                json_response(StatusCode::OK, &json!({ "activities": list }))
            }
            (&Method::GET, ["v1", "activities", id]) => match self.gw.settings.activities.get(id) {
                Some(activity) => {
                    json_response(StatusCode::OK, &self.activity_view(activity).await)
                }
                None => error(
                    StatusCode::NOT_FOUND,
                    "unknown_activity",
                    "no such activity",
                ),
            },
            (&Method::POST, ["v1", "activities", _, "reservations", _, "confirm" | "release"]) => {
                error(
                    StatusCode::NOT_IMPLEMENTED,
                    "not_implemented",
                    "confirm and release arrive with the reservation lifecycle",
                )
            }
            _ => error(StatusCode::NOT_FOUND, "not_found", "no such admin endpoint"),
        }
    }
}

impl AdminApp {
    /// An activity as the admin API shows it. `remaining` is null when the store cannot say.
    async fn activity_view(&self, activity: &Activity) -> Value {
        let remaining = self.gw.store.remaining(activity).await;
        if let Ok(Some(left)) = remaining {
            self.gw
                .metrics
                .stock_remaining
                .with_label_values(&[&activity.id])
                .set(left);
        }
        let remaining = remaining.ok().flatten();
        json!({
            "id": &*activity.id,
            "version": activity.version,
            "stock": activity.stock,
            "remaining": remaining,
            "sold_out": remaining.map(|r| r <= 0),
            "per_user_limit": activity.per_user_limit.get(),
            "max_per_request": activity.max_per_request.get(),
            "starts_at": activity.starts_at.to_rfc3339(),
            "ends_at": activity.ends_at.to_rfc3339(),
        })
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
}
