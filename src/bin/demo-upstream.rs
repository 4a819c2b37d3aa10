//! A small shop backend for demos and tests: answers every request with JSON, records what it
//! received, and can be told to fail.
//!
//! It keeps the orders it took: a request carrying a reservation (`X-Flashgate-Reservation`) that
//! it answers 2xx is an order, kept by the reservation's `jti` (read from the token's claims; a
//! real backend verifies the signature first). `GET /orders/{jti}` answers 200 for an order it
//! holds, 404 otherwise: flashgate's `upstream.order_lookup`.
//!
//! Control endpoints (same port):
//! - `GET  /__upstream/requests`              what was received, oldest first (JSON)
//! - `GET  /__upstream/orders`                the jti of every order taken (JSON)
//! - `GET  /__upstream/lookups`               the jti of every order lookup received (JSON)
//! - `POST /__upstream/reset`                 forget recorded requests, orders and lookups
//! - `POST /__upstream/mode?status=500&delay_ms=0&lookup_status=0&slow_once_ms=0&lookup_delay_ms=0`
//!   answer every other request this way (`lookup_status`: answer order lookups with this status
//!   instead, 0 = normally; `slow_once_ms`: the next request only waits this long before it is
//!   handled, as a backend that is slow once; `lookup_delay_ms`: an order lookup answers what
//!   the backend held when it arrived, this long later)
#![forbid(unsafe_code)]

use async_trait::async_trait;
use clap::Parser;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Demo shop backend for flashgate")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: String,
}

struct Backend {
    requests: Mutex<Vec<Value>>,
    orders: Mutex<std::collections::BTreeSet<String>>,
    status: AtomicU16,
    delay_ms: AtomicU64,
    lookup_status: AtomicU16,
    slow_once_ms: AtomicU64,
    lookup_delay_ms: AtomicU64,
    lookups: Mutex<Vec<String>>,
}

/// The `jti` claim of a reservation token (unverified: a demo).
fn reservation_jti(token: &[u8]) -> Option<String> {
    use base64::Engine;
    let payload = std::str::from_utf8(token).ok()?.split('.').nth(1)?;
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let claims: Value = serde_json::from_slice(&claims).ok()?;
    claims["jti"].as_str().map(str::to_owned)
}

#[async_trait]
impl ServeHttp for Backend {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.to_string();
        let path = req.uri.path().to_owned();
        let query = req.uri.query().unwrap_or("").to_owned();
        let headers: serde_json::Map<String, Value> = req
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    json!(String::from_utf8_lossy(v.as_bytes())),
                )
            })
            .collect();
        let mut body = Vec::new();
        while let Ok(Some(chunk)) = session.read_request_body().await {
            body.extend_from_slice(&chunk);
        }
        match (method.as_str(), path.as_str()) {
            ("GET", "/__upstream/requests") => {
                let recorded = self.requests.lock().expect("not poisoned").clone();
                return json_response(StatusCode::OK, &json!({ "requests": recorded }));
            }
            ("GET", "/__upstream/orders") => {
                let orders = self.orders.lock().expect("not poisoned").clone();
                return json_response(StatusCode::OK, &json!({ "orders": orders }));
            }
            ("GET", "/__upstream/lookups") => {
                let lookups = self.lookups.lock().expect("not poisoned").clone();
                return json_response(StatusCode::OK, &json!({ "lookups": lookups }));
            }
            ("GET", p) if p.starts_with("/orders/") => {
                let jti = &p["/orders/".len()..];
                self.lookups
                    .lock()
                    .expect("not poisoned")
                    .push(jti.to_owned());
                let forced = self.lookup_status.load(Ordering::SeqCst);
                if forced != 0 {
                    let status = StatusCode::from_u16(forced).unwrap_or(StatusCode::OK);
                    return json_response(status, &json!({"jti": jti}));
                }
                // What it holds now, answered after the delay (orders taken meanwhile are not
                // seen: the answer is as old as the question).
                let held = self.orders.lock().expect("not poisoned").contains(jti);
                let delay = self.lookup_delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                let status = if held {
                    StatusCode::OK
                } else {
                    StatusCode::NOT_FOUND
                };
                return json_response(status, &json!({"jti": jti, "held": held}));
            }
            ("POST", "/__upstream/reset") => {
                self.requests.lock().expect("not poisoned").clear();
                self.orders.lock().expect("not poisoned").clear();
                self.lookups.lock().expect("not poisoned").clear();
                return json_response(StatusCode::OK, &json!({"reset": true}));
            }
            ("POST", "/__upstream/mode") => {
                for pair in query.split('&') {
                    match pair.split_once('=') {
                        Some(("status", v)) => {
                            if let Ok(s) = v.parse() {
                                self.status.store(s, Ordering::SeqCst)
                            }
                        }
                        Some(("delay_ms", v)) => {
                            if let Ok(d) = v.parse() {
                                self.delay_ms.store(d, Ordering::SeqCst)
                            }
                        }
                        Some(("lookup_status", v)) => {
                            if let Ok(s) = v.parse() {
                                self.lookup_status.store(s, Ordering::SeqCst)
                            }
                        }
                        Some(("slow_once_ms", v)) => {
                            if let Ok(d) = v.parse() {
                                self.slow_once_ms.store(d, Ordering::SeqCst)
                            }
                        }
                        Some(("lookup_delay_ms", v)) => {
                            if let Ok(d) = v.parse() {
                                self.lookup_delay_ms.store(d, Ordering::SeqCst)
                            }
                        }
                        _ => {}
                    }
                }
                return json_response(StatusCode::OK, &json!({"mode": query}));
            }
            _ => {}
        }
        self.requests.lock().expect("not poisoned").push(json!({
            "method": method,
            "path": path,
            "query": query,
            "headers": headers,
            "body": String::from_utf8_lossy(&body),
        }));
        let delay = match self.slow_once_ms.swap(0, Ordering::SeqCst) {
            0 => self.delay_ms.load(Ordering::SeqCst),
            once => once,
        };
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let status =
            StatusCode::from_u16(self.status.load(Ordering::SeqCst)).unwrap_or(StatusCode::OK);
        if status.is_success() {
            let reservation = session.req_header().headers.get("x-flashgate-reservation");
            if let Some(jti) = reservation.and_then(|t| reservation_jti(t.as_bytes())) {
                self.orders.lock().expect("not poisoned").insert(jti);
            }
        }
        json_response(status, &json!({"ok": status.is_success(), "path": path}))
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec(body).expect("JSON values serialize");
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .expect("static response parts")
}

fn main() {
    let args = Args::parse();
    let conf = ServerConf {
        threads: 1,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let backend = Backend {
        requests: Mutex::new(Vec::new()),
        orders: Mutex::new(std::collections::BTreeSet::new()),
        status: AtomicU16::new(200),
        delay_ms: AtomicU64::new(0),
        lookup_status: AtomicU16::new(0),
        slow_once_ms: AtomicU64::new(0),
        lookup_delay_ms: AtomicU64::new(0),
        lookups: Mutex::new(Vec::new()),
    };
    let mut service = Service::new("demo upstream".to_owned(), backend);
    service.add_tcp(&args.listen);
    server.add_service(service);
    println!("demo upstream listening on {}", args.listen);
    server.run_forever();
}
