//! A small shop backend for demos and tests: answers every request with JSON, records what it
//! received, and can be told to fail.
//!
//! It keeps the orders it took: a request carrying a reservation (`X-Flashgate-Reservation`) that
//! it answers 2xx is an order, kept by the reservation's `jti` (read from the token's claims).
//! `GET /orders/{jti}` answers 200 for an order it holds, 404 otherwise: flashgate's
//! `upstream.order_lookup`. The answer to an order from a browser (a request with cookies) sets the cookie
//! `demo_order=<jti>`.
//!
//! Signatures, as a real backend checks them (both off by default: the token's `jti` is then
//! read unverified and the peer's grants are not looked at):
//! - `--verify-secret S` (or `DEMO_UPSTREAM_VERIFY_SECRET`): the HS256 secret flashgate signs
//!   reservations with (`signing.secret_env`); a reservation whose HMAC-SHA256 does not verify is
//!   answered 403 and is no order.
//! - `--peer-secret S` (or `DEMO_UPSTREAM_PEER_SECRET`): the secret of scripts/bench's OpenResty
//!   peer; its `X-Seckill-Grant: act:user:qty:ts:base64(HMAC-SHA256(act:user:qty:ts))` is
//!   verified the same way and the grant kept by `act:user` (one per buyer and activity), in a
//!   set like the orders; a bad grant is answered 403.
//!
//! So that scripts/bench's upstream does the same work for each side's winners: one HMAC-SHA256
//! check and one insert into a set. Neither side's expiry is checked.
//!
//! Control endpoints (same port):
//! - `GET  /__upstream/requests`              what was received, oldest first (JSON)
//! - `GET  /__upstream/orders`                the jti of every order taken (JSON)
//! - `GET  /__upstream/lookups`               the jti of every order lookup received (JSON)
//! - `GET  /__upstream/grants`                the peer's grants taken (`act:user`, with
//!   `--peer-secret`) and how many requests were answered 403 for a bad signature (JSON)
//! - `POST /__upstream/reset`                 forget recorded requests, orders, grants, lookups
//!   and the count of bad signatures
//! - `POST /__upstream/mode?status=500&delay_ms=0&lookup_status=0&slow_once_ms=0&lookup_delay_ms=0`
//!   answer every other request this way (`lookup_status`: answer order lookups with this status
//!   instead, 0 = normally; `slow_once_ms`: the next request only waits this long before it is
//!   handled, as a backend that is slow once; `lookup_delay_ms`: an order lookup answers what
//!   the backend held when it arrived, this long later)
#![forbid(unsafe_code)]

use async_trait::async_trait;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use clap::Parser;
use hmac::{Hmac, KeyInit, Mac};
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;
use serde_json::{json, Value};
use sha2::Sha256;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Demo shop backend for flashgate")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: String,
    /// HS256 secret of flashgate's reservation tokens: verify their signature (default: the
    /// `DEMO_UPSTREAM_VERIFY_SECRET` environment variable; neither: the `jti` is read unverified).
    #[arg(long)]
    verify_secret: Option<String>,
    /// Secret of the OpenResty peer's `X-Seckill-Grant` (scripts/bench-peer/seckill.lua): verify
    /// and keep its grants (default: `DEMO_UPSTREAM_PEER_SECRET`; neither: grants are ignored).
    #[arg(long)]
    peer_secret: Option<String>,
}

type HmacSha256 = Hmac<Sha256>;

/// A flag, else its environment variable; empty is unset.
fn secret(flag: Option<String>, var: &str) -> Option<HmacSha256> {
    let secret = flag
        .or_else(|| std::env::var(var).ok())
        .filter(|s| !s.is_empty())?;
    Some(HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length"))
}

struct Backend {
    requests: Mutex<Vec<Value>>,
    orders: Mutex<std::collections::BTreeSet<String>>,
    /// The peer's grants taken, by `act:user` (with `--peer-secret`).
    grants: Mutex<std::collections::BTreeSet<String>>,
    /// Requests answered 403 because a reservation's or grant's signature did not verify.
    rejected: AtomicU64,
    /// `--verify-secret`: flashgate's reservations are verified with this key.
    reservation_key: Option<HmacSha256>,
    /// `--peer-secret`: the peer's grants are verified with this key and kept.
    grant_key: Option<HmacSha256>,
    status: AtomicU16,
    delay_ms: AtomicU64,
    lookup_status: AtomicU16,
    slow_once_ms: AtomicU64,
    lookup_delay_ms: AtomicU64,
    lookups: Mutex<Vec<String>>,
}

/// The `jti` claim of a reservation token; with a key, only if its HS256 signature verifies
/// (`Err`: it does not). `Ok(None)`: no `jti` to read.
fn reservation_jti(token: &[u8], key: Option<&HmacSha256>) -> Result<Option<String>, BadSignature> {
    let Ok(token) = std::str::from_utf8(token) else {
        return if key.is_some() {
            Err(BadSignature)
        } else {
            Ok(None)
        };
    };
    if let Some(key) = key {
        let (signed, signature) = token.rsplit_once('.').ok_or(BadSignature)?;
        verify(key, signed, signature, &URL_SAFE_NO_PAD)?;
    }
    let Some(payload) = token.split('.').nth(1) else {
        return Ok(None);
    };
    let Ok(claims) = URL_SAFE_NO_PAD.decode(payload) else {
        return Ok(None);
    };
    let claims: Value = serde_json::from_slice(&claims).unwrap_or(Value::Null);
    Ok(claims["jti"].as_str().map(str::to_owned))
}

/// The OpenResty peer's grant, `act:user:qty:ts:base64(HMAC-SHA256(act:user:qty:ts))`, verified:
/// its `act:user` (the buyer may contain ':', the activity may not, as scripts/bench-peer/record.py
/// reads it).
fn grant_id(grant: &[u8], key: &HmacSha256) -> Result<String, BadSignature> {
    let grant = std::str::from_utf8(grant).map_err(|_| BadSignature)?;
    let (signed, signature) = grant.rsplit_once(':').ok_or(BadSignature)?;
    verify(key, signed, signature, &STANDARD)?;
    let mut fields = signed.rsplitn(3, ':');
    let (_ts, _qty) = (fields.next(), fields.next());
    match fields.next() {
        Some(act_user) if act_user.contains(':') => Ok(act_user.to_owned()),
        _ => Err(BadSignature),
    }
}

/// A reservation or grant whose signature is missing or does not verify.
#[derive(Debug)]
struct BadSignature;

/// HMAC-SHA256 of `signed` under `key` against `signature` (base64 in `engine`'s alphabet),
/// compared in constant time.
fn verify(
    key: &HmacSha256,
    signed: &str,
    signature: &str,
    engine: &impl Engine,
) -> Result<(), BadSignature> {
    let signature = engine.decode(signature).map_err(|_| BadSignature)?;
    let mut mac = key.clone();
    mac.update(signed.as_bytes());
    mac.verify_slice(&signature).map_err(|_| BadSignature)
}

/// What a request the upstream answers 2xx takes, by its headers.
enum Taken {
    /// A flashgate reservation: an order, by `jti`.
    Order(String),
    /// A peer's grant (with `--peer-secret`): by `act:user`.
    Grant(String),
}

impl Backend {
    fn taken(&self, headers: &http::HeaderMap) -> Result<Option<Taken>, BadSignature> {
        if let Some(token) = headers.get("x-flashgate-reservation") {
            let jti = reservation_jti(token.as_bytes(), self.reservation_key.as_ref())?;
            return Ok(jti.map(Taken::Order));
        }
        match (headers.get("x-seckill-grant"), &self.grant_key) {
            (Some(grant), Some(key)) => Ok(Some(Taken::Grant(grant_id(grant.as_bytes(), key)?))),
            _ => Ok(None),
        }
    }
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
            ("GET", "/__upstream/grants") => {
                let grants = self.grants.lock().expect("not poisoned").clone();
                let rejected = self.rejected.load(Ordering::SeqCst);
                return json_response(
                    StatusCode::OK,
                    &json!({ "grants": grants, "rejected": rejected }),
                );
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
                self.grants.lock().expect("not poisoned").clear();
                self.rejected.store(0, Ordering::SeqCst);
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
            match self.taken(&session.req_header().headers) {
                Ok(Some(Taken::Order(jti))) => {
                    // As a shop does: a browser (a buyer with a session cookie) keeps the order
                    // it just made. Other clients (scripts/bench's) get the usual answer.
                    let browser = session
                        .req_header()
                        .headers
                        .contains_key(http::header::COOKIE);
                    let cookie = format!("demo_order={jti}; Path=/").parse().ok();
                    self.orders.lock().expect("not poisoned").insert(jti);
                    if let (true, Some(cookie)) = (browser, cookie) {
                        let mut answer = json_response(status, &json!({"ok": true, "path": path}));
                        answer
                            .headers_mut()
                            .insert(http::header::SET_COOKIE, cookie);
                        return answer;
                    }
                }
                Ok(Some(Taken::Grant(id))) => {
                    self.grants.lock().expect("not poisoned").insert(id);
                }
                Ok(None) => {}
                Err(BadSignature) => {
                    self.rejected.fetch_add(1, Ordering::SeqCst);
                    return json_response(
                        StatusCode::FORBIDDEN,
                        &json!({"ok": false, "path": path, "error": "bad signature"}),
                    );
                }
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
        grants: Mutex::new(std::collections::BTreeSet::new()),
        rejected: AtomicU64::new(0),
        reservation_key: secret(args.verify_secret, "DEMO_UPSTREAM_VERIFY_SECRET"),
        grant_key: secret(args.peer_secret, "DEMO_UPSTREAM_PEER_SECRET"),
        status: AtomicU16::new(200),
        delay_ms: AtomicU64::new(0),
        lookup_status: AtomicU16::new(0),
        slow_once_ms: AtomicU64::new(0),
        lookup_delay_ms: AtomicU64::new(0),
        lookups: Mutex::new(Vec::new()),
    };
    let checks = format!(
        "reservations {}, peer grants {}",
        ["unverified", "verified"][usize::from(backend.reservation_key.is_some())],
        ["ignored", "verified"][usize::from(backend.grant_key.is_some())],
    );
    let mut service = Service::new("demo upstream".to_owned(), backend);
    service.add_tcp(&args.listen);
    server.add_service(service);
    println!("demo upstream listening on {} ({checks})", args.listen);
    server.run_forever();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(secret: &str) -> HmacSha256 {
        HmacSha256::new_from_slice(secret.as_bytes()).unwrap()
    }

    /// An HS256 token as flashgate signs one (jsonwebtoken, a `kid` in the header).
    fn token(secret: &str, jti: &str) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("k1".to_owned());
        jsonwebtoken::encode(
            &header,
            &json!({"jti": jti, "sub": "u1", "exp": 4_000_000_000u64}),
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
        )
        .unwrap()
    }

    /// A grant as scripts/bench-peer/seckill.lua makes one.
    fn grant(secret: &str, signed: &str) -> String {
        let mut mac = key(secret);
        mac.update(signed.as_bytes());
        format!("{signed}:{}", STANDARD.encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn reservations_are_read_unverified_without_a_key_and_verified_with_one() {
        let t = token("s3cret", "j-1");
        let jti = |t: &str, k: Option<&HmacSha256>| reservation_jti(t.as_bytes(), k);
        assert_eq!(jti(&t, None).unwrap().as_deref(), Some("j-1"));
        assert_eq!(
            jti(&t, Some(&key("s3cret"))).unwrap().as_deref(),
            Some("j-1")
        );
        assert!(jti(&t, Some(&key("other"))).is_err());
        // A changed claim, the signature kept: refused only when verifying.
        let mut parts: Vec<String> = t.split('.').map(str::to_owned).collect();
        parts[1] = URL_SAFE_NO_PAD.encode(br#"{"jti":"j-2"}"#);
        let forged = parts.join(".");
        assert_eq!(jti(&forged, None).unwrap().as_deref(), Some("j-2"));
        assert!(jti(&forged, Some(&key("s3cret"))).is_err());
        assert!(jti("not a token", Some(&key("s3cret"))).is_err());
        assert_eq!(jti("not a token", None).unwrap(), None);
    }

    #[test]
    fn peer_grants_are_verified_and_kept_by_activity_and_buyer() {
        let k = key("peer-bench-secret");
        let g = grant("peer-bench-secret", "hot:wp1-42:1:1764583200");
        assert_eq!(grant_id(g.as_bytes(), &k).unwrap(), "hot:wp1-42");
        // A buyer with ':' in the id, as record.py reads it.
        let g = grant("peer-bench-secret", "hot:a:b:1:1764583200");
        assert_eq!(grant_id(g.as_bytes(), &k).unwrap(), "hot:a:b");
        let g = grant("other", "hot:wp1-42:1:1764583200");
        assert!(grant_id(g.as_bytes(), &k).is_err());
        let g = grant("peer-bench-secret", "hot:wp1-42:1:1764583200").replace("wp1-42", "wp1-43");
        assert!(grant_id(g.as_bytes(), &k).is_err());
        assert!(grant_id(b"", &k).is_err());
    }
}
