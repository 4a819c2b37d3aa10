//! The bare-Pingora floor for `scripts/bench`: the same Pingora proxy service flashgate runs,
//! configured the same way (`threads`, no downstream modules, the same upstream peer options),
//! with none of flashgate's logic. What flashgate measures above this is its own cost.
//!
//! - `--mode refuse`: every request is answered `410 {"code":"sold_out","message":"sold out"}`
//!   with the headers flashgate writes on its own answers (floor for sold-out and refusal paths).
//! - `--mode proxy`: every request is proxied to `--upstream` unchanged (floor for winners).
//!
//! ```sh
//! cargo build --release --examples
//! target/release/examples/bare_pingora --listen 127.0.0.1:8090 --mode refuse
//! ```
#![forbid(unsafe_code)]

use async_trait::async_trait;
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::http_proxy;
use pingora::server::configuration::ServerConf;
use pingora::services::listening::Service;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Answer every request with a fixed 410 sold_out.
    Refuse,
    /// Proxy every request to the upstream, no logic.
    Proxy,
}

#[derive(Parser)]
#[command(about = "Bare Pingora: the floor flashgate's proxy is measured against")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: String,
    #[arg(long, value_enum)]
    mode: Mode,
    /// Where `--mode proxy` sends requests.
    #[arg(long, default_value = "127.0.0.1:9000")]
    upstream: SocketAddr,
    /// Worker threads (flashgate's bench config: 2).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Upstream connect timeout (flashgate's bench config: 1000 ms).
    #[arg(long, default_value_t = 1000)]
    connect_timeout_ms: u64,
    /// Upstream read timeout (flashgate's bench config: 5000 ms).
    #[arg(long, default_value_t = 5000)]
    read_timeout_ms: u64,
}

const SOLD_OUT_BODY: &[u8] = br#"{"code":"sold_out","message":"sold out"}"#;

struct Bare {
    mode: Mode,
    upstream: SocketAddr,
    connect_timeout: Duration,
    read_timeout: Duration,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    // As flashgate: no downstream modules.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        // With `--features dhat-heap`: the allocations so far (scripts/alloc-per-request).
        #[cfg(feature = "dhat-heap")]
        if session.req_header().uri.path() == "/__allocs" {
            let body = Bytes::from(dhat::HeapStats::get().total_blocks.to_string());
            let mut resp = ResponseHeader::build(200, Some(2))?;
            resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
            session.write_response_header(Box::new(resp), false).await?;
            session.write_response_body(Some(body), true).await?;
            return Ok(true);
        }
        if self.mode == Mode::Proxy {
            return Ok(false);
        }
        // The same answer flashgate writes (src/proxy/respond.rs).
        let body = Bytes::from_static(SOLD_OUT_BODY);
        let mut resp = ResponseHeader::build(410, Some(5))?;
        resp.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
        resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
        session.write_response_header(Box::new(resp), false).await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        // As flashgate's Upstreams::peer: plain HTTP, no SNI, the configured timeouts.
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        peer.options.connection_timeout = Some(self.connect_timeout);
        peer.options.read_timeout = Some(self.read_timeout);
        Ok(Box::new(peer))
    }
}

#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn main() {
    #[cfg(feature = "dhat-heap")]
    std::mem::forget(dhat::Profiler::builder().testing().build());
    let args = Args::parse();
    let conf = ServerConf {
        threads: args.threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let bare = Bare {
        mode: args.mode,
        upstream: args.upstream,
        connect_timeout: Duration::from_millis(args.connect_timeout_ms),
        read_timeout: Duration::from_millis(args.read_timeout_ms),
    };
    let mut proxy = Service::new(
        "bare pingora".to_owned(),
        http_proxy(&server.configuration, bare),
    );
    proxy.add_tcp(&args.listen);
    server.add_service(proxy);
    println!("bare pingora listening on {}", args.listen);
    server.run_forever();
}
