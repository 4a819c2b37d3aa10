//! A small shop backend for demos and tests: answers every request with JSON, records what it
//! received, and can be told to fail.
//!
//! Control endpoints (same port):
//! - `GET  /__upstream/requests`              what was received, oldest first (JSON)
//! - `POST /__upstream/reset`                 forget recorded requests
//! - `POST /__upstream/mode?status=500&delay_ms=0`  answer every other request this way
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
    status: AtomicU16,
    delay_ms: AtomicU64,
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
            ("POST", "/__upstream/reset") => {
                self.requests.lock().expect("not poisoned").clear();
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
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let status =
            StatusCode::from_u16(self.status.load(Ordering::SeqCst)).unwrap_or(StatusCode::OK);
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
        status: AtomicU16::new(200),
        delay_ms: AtomicU64::new(0),
    };
    let mut service = Service::new("demo upstream".to_owned(), backend);
    service.add_tcp(&args.listen);
    server.add_service(service);
    println!("demo upstream listening on {}", args.listen);
    server.run_forever();
}
