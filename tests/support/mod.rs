//! Real processes for tests: a private redis-server, the demo upstream, the flashgate binary, and
//! a small raw HTTP/1.1 client. Every process gets a free port and a temp dir and is killed on
//! drop. Nothing here sleeps for timing: readiness is polled with a deadline. By job:
//! `process` (ports, bounded runs, polling), `redis_server` (Redis and Redis Cluster),
//! `upstream` (the demo backend), `gateway` (the binary and its CLI), `http` (a raw client,
//! metrics), `store` (the stock store in process), `test_config` (the YAML), `pipeline` (the
//! gateway's parts in process, for the model tests), `bad_yaml` (the refused-config table).
#![allow(dead_code)]

use serde_json::Value;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub mod pipeline;
mod test_config;
pub use test_config::*;

mod gateway;
pub mod generated;
mod http;
mod process;
mod redis_server;
mod store;
mod upstream;
// Each test binary uses a part of the support: an unused part is no warning (as `dead_code`).
#[allow(unused_imports)]
pub use gateway::*;
#[allow(unused_imports)]
pub use http::*;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use redis_server::*;
#[allow(unused_imports)]
pub use store::*;
#[allow(unused_imports)]
pub use upstream::*;
