//! Real processes for tests: a private redis-server, the demo upstream, the flashgate binary, and
//! a small raw HTTP/1.1 client. Every process gets a free port and a temp dir and is killed on
//! drop. Nothing here sleeps for timing: readiness is polled with a deadline.
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

/// An activity open from 2020 to 2099, for tests that talk to the stock store directly.
pub fn store_activity(
    id: &str,
    stock: u64,
    version: u64,
    limit: u32,
    confirm: flashgate::config::ConfirmMode,
    hold: Duration,
) -> flashgate::config::Activity {
    use chrono::TimeZone;
    use std::num::NonZeroU32;
    flashgate::config::Activity {
        id: std::sync::Arc::from(id),
        lane: std::sync::Arc::from(id),
        variants: std::sync::Arc::from(Vec::new()),
        variant: None,
        stock,
        version,
        per_user_limit: NonZeroU32::new(limit).unwrap(),
        max_per_request: NonZeroU32::new(limit).unwrap(),
        starts_at: chrono::Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).unwrap(),
        ends_at: chrono::Utc.with_ymd_and_hms(2099, 1, 1, 0, 0, 0).unwrap(),
        confirm,
        on_store_failure: flashgate::config::StoreFailurePolicy::Reject,
        hold,
        segments: 1,
        queue: None,
    }
}

/// A stock store on a single Redis (`cluster_nodes` empty) or a cluster.
pub fn stock_store(
    url: String,
    cluster_nodes: Vec<String>,
    timeout: Duration,
) -> flashgate::stock::StockStore {
    let settings = flashgate::config::RedisSettings {
        url,
        cluster_nodes,
        timeout,
        key_prefix: "fg".into(),
        key_ttl_after_end: Duration::from_secs(86_400),
        prewarm_interval: Duration::from_secs(5),
        sweep_interval: Duration::from_secs(1),
        sweep_batch: 100,
        reconcile_interval: Duration::from_secs(10),
        events_maxlen: 1000,
        allow_eviction: false,
        ack_replicas: 0,
    };
    let metrics = std::sync::Arc::new(flashgate::metrics::Metrics::new());
    // No birth hold: these tests drive the scripts without a gateway's periodic master checks
    // (the gateway binary holds; tests/doubt.rs and tests/e2e show the hold).
    flashgate::stock::StockStore::new(&settings, metrics)
        .unwrap()
        .with_birth_hold(Duration::ZERO)
}

pub const SIGNING_SECRET: &str = "test-signing-secret-0123456789abcdef";
pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(30);

/// Ports for servers the tests start, below the kernel's ephemeral range (32768 and up): a port
/// handed out here cannot meanwhile become the local end of some client's connection, which
/// happens with `bind(:0)` ports while other tests open thousands of connections. Each port is
/// handed out once per test binary; binaries run one after another.
const GENERAL_PORTS: std::ops::Range<u16> = 23_000..32_700;
/// Cluster nodes: their bus ports (+10000) fall in 20000..23000, which nothing else uses.
const CLUSTER_PORTS: std::ops::Range<u16> = 10_000..13_000;

fn next_port(range: std::ops::Range<u16>, next: &std::sync::atomic::AtomicU32) -> u16 {
    use std::sync::atomic::Ordering;
    let len = u32::from(range.end - range.start);
    // Start somewhere the process id picks, so two binaries run by hand side by side rarely meet.
    let start = (u64::from(std::process::id()) * 2_654_435_761 % u64::from(len)) as u32 + 1;
    let _ = next.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..len {
        let port = range.start + (next.fetch_add(1, Ordering::SeqCst) % len) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {range:?}");
}

pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    next_port(GENERAL_PORTS, &NEXT)
}

/// A port for a cluster node whose bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    loop {
        let port = next_port(CLUSTER_PORTS, &NEXT);
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Runs `cmd` to completion within `deadline`, killing it and panicking (naming `what`) if it
/// takes longer: a stuck child must fail its test, not hang the run.
pub fn run_bounded(what: &str, cmd: &mut Command, deadline: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} could not start: {e}"));
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_for_exit(&mut child, deadline).unwrap_or_else(|| {
        kill(&mut child);
        panic!("{what} did not finish within {deadline:?}");
    });
    std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Polls `child` until it exits or `deadline` passes.
pub fn wait_for_exit(child: &mut Child, deadline: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return Some(status);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `deadline`.
pub fn wait_for<T>(what: &str, deadline: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Async variant of [`wait_for`].
pub async fn wait_for_async<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A private redis-server on a free port in a temp dir.
pub struct RedisServer {
    pub port: u16,
    dir: TempDir,
    /// `appendfsync` of an append-only file; `None`: no persistence.
    fsync: Option<&'static str>,
    child: Option<Child>,
    /// Killed when the test process exits (see [`reap_at_exit`]), every spawn.
    reaped: bool,
}

/// A process held in a `static` is never dropped: it would outlive the test binary. This
/// watches the test process and, once it is gone, kills `pid` (if it is still the process
/// whose command line names `mark`, not a pid reused since) and removes `dir`. The watcher is a
/// `sh` loop polling twice a second; it ends with the test process.
// Never waited for: it outlives the test process by design (then init reaps it).
#[allow(clippy::zombie_processes)]
pub fn reap_at_exit(pid: u32, mark: &str, dir: Option<&Path>) {
    let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
if grep -qaF -- "$3" "/proc/$2/cmdline" 2>/dev/null; then kill -9 "$2"; fi
if [ -n "$4" ]; then rm -rf -- "$4"; fi"#;
    Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(std::process::id().to_string())
        .arg(pid.to_string())
        .arg(mark)
        .arg(dir.map(|d| d.as_os_str().to_owned()).unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sh starts");
}

impl RedisServer {
    /// No persistence: fast, for most tests.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// AOF with fsync on every write, so a SIGKILL loses nothing.
    pub fn start_durable() -> Self {
        Self::start_with(Some("always"))
    }

    /// An append-only file with this `appendfsync` (`always`, `everysec`, `no`).
    pub fn start_aof(fsync: &'static str) -> Self {
        Self::start_with(Some(fsync))
    }

    /// The server's working directory (its append-only files live in `appendonlydir/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn start_with(fsync: Option<&'static str>) -> Self {
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            fsync,
            child: None,
            reaped: false,
        };
        server.spawn();
        server
    }

    /// For a server held in a `static`: killed (and its dir removed) when the test process
    /// exits, after a restart too. One watcher per server, whatever the restarts: it reads the
    /// server's current pid from a file the server's every start writes (a watcher per start
    /// piled up, hundreds of `sh` loops in a long model run).
    // Never waited for: it outlives the test process by design (then init reaps it).
    #[allow(clippy::zombie_processes)]
    pub fn reaped_at_exit(mut self) -> Self {
        self.reaped = true;
        self.write_pid();
        let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
pid=$(cat "$2/reaped.pid" 2>/dev/null)
if [ -n "$pid" ] && grep -qaF -- "$3" "/proc/$pid/cmdline" 2>/dev/null; then kill -9 "$pid"; fi
rm -rf -- "$2""#;
        Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(std::process::id().to_string())
            .arg(self.dir.path())
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh starts");
        self
    }

    /// Where the watcher of [`RedisServer::reaped_at_exit`] finds the current pid.
    fn write_pid(&self) {
        if let Some(pid) = self.pid() {
            let _ = std::fs::write(self.dir.path().join("reaped.pid"), pid.to_string());
        }
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("");
        if let Some(fsync) = self.fsync {
            cmd.args(["--appendonly", "yes", "--appendfsync", fsync]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test installs it)");
        self.child = Some(child);
        if self.reaped {
            self.write_pid();
        }
        let client = self.client();
        wait_for("redis-server to answer PING", STARTUP_DEADLINE, || {
            let mut conn = client.get_connection().ok()?;
            redis::cmd("PING").query::<String>(&mut conn).ok()
        });
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A field of the server's `INFO replication` ('' when absent).
    pub fn replication(&self, field: &str) -> String {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// Script calls (EVAL and EVALSHA) Redis ran so far (`INFO commandstats`).
    pub fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid url")
    }

    pub fn conn(&self) -> redis::Connection {
        self.client().get_connection().expect("redis connection")
    }

    /// SIGKILL, like a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child);
        }
    }

    /// Starts again on the same port and dir (a durable server comes back with its data).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private 3-master Redis Cluster: three `redis-server --cluster-enabled yes` on free ports
/// (and free bus ports, +10000), joined with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    dirs: Vec<TempDir>,
    children: Vec<Child>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let ports: Vec<u16> = (0..3).map(|_| free_cluster_port()).collect();
        let mut cluster = RedisCluster {
            ports: ports.clone(),
            dirs: Vec::new(),
            children: Vec::new(),
        };
        for port in &ports {
            let dir = tempfile::tempdir().expect("temp dir");
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            cluster.children.push(child);
            cluster.dirs.push(dir);
            let url = format!("redis://127.0.0.1:{port}/");
            wait_for("a cluster node to answer", STARTUP_DEADLINE, || {
                let mut conn = redis::Client::open(url.as_str())
                    .ok()?
                    .get_connection()
                    .ok()?;
                redis::cmd("PING").query::<String>(&mut conn).ok()
            });
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        // redis-cli waits for the nodes to meet with no limit of its own.
        let out = run_bounded(
            "redis-cli --cluster create",
            Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(&nodes)
                .args(["--cluster-replicas", "0", "--cluster-yes"]),
            STARTUP_DEADLINE,
        );
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for port in &ports {
            let url = format!("redis://127.0.0.1:{port}/");
            wait_for("the cluster to be ok", STARTUP_DEADLINE, || {
                let mut conn = redis::Client::open(url.as_str())
                    .ok()?
                    .get_connection()
                    .ok()?;
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).ok()?;
                info.contains("cluster_state:ok").then_some(())
            });
        }
        cluster
    }

    pub fn nodes(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// A cluster-aware synchronous connection, for assertions.
    pub fn conn(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect();
        redis::cluster::ClusterClient::new(urls)
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// Connections the nodes have accepted since they started, summed (INFO stats).
    pub fn connections_received(&self) -> u64 {
        self.ports
            .iter()
            .map(|p| {
                let url = format!("redis://127.0.0.1:{p}/");
                let mut c = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let info: String = redis::cmd("INFO").arg("stats").query(&mut c).unwrap();
                info.lines()
                    .find_map(|l| l.strip_prefix("total_connections_received:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .expect("total_connections_received")
            })
            .sum()
    }

    /// The port of the master serving `key` (from CLUSTER SLOTS).
    pub fn node_of(&self, key: &str) -> u16 {
        let mut conn = self.conn();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        let url = format!("redis://127.0.0.1:{}/", self.ports[0]);
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).unwrap();
        let int = |v: &redis::Value| match v {
            redis::Value::Int(i) => *i,
            _ => -1,
        };
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            if (int(&parts[0])..=int(&parts[1])).contains(&slot) {
                if let redis::Value::Array(master) = &parts[2] {
                    return int(&master[1]) as u16;
                }
            }
        }
        panic!("no node serves slot {slot}");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            kill(child);
        }
    }
}

/// The demo upstream binary, recording what it receives.
pub struct Upstream {
    pub addr: SocketAddr,
    child: Child,
}

impl Upstream {
    pub fn start() -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_demo-upstream"))
            .arg("--listen")
            .arg(addr.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("demo-upstream starts");
        wait_for("demo upstream to listen", STARTUP_DEADLINE, || {
            std::net::TcpStream::connect(addr).ok()
        });
        Upstream { addr, child }
    }

    /// For an upstream held in a `static`: killed when the test process exits.
    pub fn reaped_at_exit(self) -> Self {
        reap_at_exit(self.child.id(), &self.addr.to_string(), None);
        self
    }

    /// Requests received, oldest first, excluding control requests.
    pub async fn requests(&self) -> Vec<Value> {
        let resp = get(self.addr, "/__upstream/requests", &[]).await;
        resp.json()["requests"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub async fn set_status(&self, status: u16) {
        let resp = request(
            self.addr,
            "POST",
            &format!("/__upstream/mode?status={status}"),
            &[],
        )
        .await;
        assert_eq!(resp.status, 200);
    }

    pub async fn reset(&self) {
        request(self.addr, "POST", "/__upstream/reset", &[]).await;
    }

    /// Sets the demo backend's mode (`status=500&delay_ms=0&slow_once_ms=..&lookup_delay_ms=..`).
    pub async fn mode(&self, query: &str) {
        let resp = request(self.addr, "POST", &format!("/__upstream/mode?{query}"), &[]).await;
        assert_eq!(resp.status, 200);
    }

    /// The jti of every order the backend took.
    pub async fn orders(&self) -> Vec<String> {
        let resp = get(self.addr, "/__upstream/orders", &[]).await;
        serde_json::from_value(resp.json()["orders"].clone()).unwrap_or_default()
    }

    /// The jti of every order lookup the backend received.
    pub async fn lookups(&self) -> Vec<String> {
        let resp = get(self.addr, "/__upstream/lookups", &[]).await;
        serde_json::from_value(resp.json()["lookups"].clone()).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        kill(&mut self.child);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// The usual three processes: a private Redis, the demo upstream, and a gateway between them.
pub struct Stack {
    pub redis: RedisServer,
    pub upstream: Upstream,
    pub gw: GatewayProc,
}

impl Stack {
    pub fn start(activities: Vec<TestActivity>) -> Stack {
        Self::start_with(activities, |config| config)
    }

    /// The three processes, to be bound by name (`let (_redis, upstream, gw) = ...`): a process
    /// whose binding is dropped is killed.
    pub fn parts(self) -> (RedisServer, Upstream, GatewayProc) {
        (self.redis, self.upstream, self.gw)
    }

    /// The stack with the gateway's configuration changed by `configure` first.
    pub fn start_with(
        activities: Vec<TestActivity>,
        configure: impl FnOnce(TestConfig) -> TestConfig,
    ) -> Stack {
        let (redis, upstream, config) = backends(activities);
        let gw = GatewayProc::start(configure(config));
        Stack {
            redis,
            upstream,
            gw,
        }
    }
}

/// A private Redis, the demo upstream, and a gateway configuration between them (no gateway
/// started yet).
pub fn backends(activities: Vec<TestActivity>) -> (RedisServer, Upstream, TestConfig) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = TestConfig::new(&redis, &upstream, activities);
    (redis, upstream, config)
}

impl RedisServer {
    /// An integer key, `None` if it does not exist.
    pub fn get_int(&self, key: &str) -> Option<i64> {
        redis::cmd("GET").arg(key).query(&mut self.conn()).unwrap()
    }

    /// Units `user` holds in `activity`.
    pub fn held(&self, activity: &str, user: &str) -> Option<i64> {
        redis::cmd("HGET")
            .arg(format!("fg:{{{activity}}}:users"))
            .arg(user)
            .query(&mut self.conn())
            .unwrap()
    }

    /// The record of reservation `jti` in the segment tagged `tag` (`1001`, `1001~0/2`):
    /// `state|...`.
    pub fn record(&self, tag: &str, jti: &str) -> Option<String> {
        redis::cmd("HGET")
            .arg(format!("fg:{{{tag}}}:res"))
            .arg(jti)
            .query(&mut self.conn())
            .unwrap()
    }

    /// The record of `jti` once it is in `state` (`confirmed`, `released`, ...), polled.
    pub fn wait_record(&self, tag: &str, jti: &str, state: &str) -> String {
        let prefix = format!("{state}|");
        wait_for(
            &format!("reservation {jti} in {tag} to be {state}"),
            Duration::from_secs(15),
            || self.record(tag, jti).filter(|r| r.starts_with(&prefix)),
        )
    }

    /// The hold deadline (Redis milliseconds) in the record of `jti`.
    pub fn hold_deadline_ms(&self, tag: &str, jti: &str) -> u64 {
        let record = self.record(tag, jti).expect("a record");
        record.split('|').nth(4).unwrap().parse().unwrap()
    }

    /// `BGREWRITEAOF`, waited for (what was written before is then in the append-only file).
    pub fn rewrite_aof(&self) {
        let _: () = redis::cmd("BGREWRITEAOF").query(&mut self.conn()).unwrap();
        wait_for("the AOF rewritten", Duration::from_secs(20), || {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query(&mut self.conn())
                .unwrap();
            info.contains("aof_rewrite_in_progress:0").then_some(())
        });
    }

    /// Redis's clock, in milliseconds.
    pub fn time_ms(&self) -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut self.conn()).unwrap();
        s * 1000 + us / 1000
    }

    /// Polls until Redis's clock passes `ms`.
    pub fn wait_time_past(&self, what: &str, ms: u64) {
        wait_for(what, Duration::from_secs(10), || {
            (self.time_ms() > ms).then_some(())
        });
    }

    /// Deletes `keys`.
    pub fn del(&self, keys: &[&str]) {
        let _: () = redis::cmd("DEL").arg(keys).query(&mut self.conn()).unwrap();
    }

    /// How many of `keys` exist.
    pub fn exists(&self, keys: &[&str]) -> i64 {
        redis::cmd("EXISTS")
            .arg(keys)
            .query(&mut self.conn())
            .unwrap()
    }

    /// The keys matching `pattern`.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.conn())
            .unwrap()
    }
}

/// The flashgate binary running `serve` with a test configuration.
pub struct GatewayProc {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub config: TestConfig,
    env: Vec<(String, String)>,
    /// Extra arguments to `serve` (e.g. `--upgrade`).
    args: Vec<String>,
    dir: TempDir,
    child: Option<Child>,
}

/// libfaketime's path: a process started with it preloaded runs on a clock of the test's
/// choosing (see [`GatewayProc::start_skewed`]).
pub fn libfaketime() -> String {
    std::fs::read_dir("/usr/lib")
        .unwrap()
        .filter_map(|d| d.ok())
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists())
        .expect("libfaketime (Debian package faketime) is needed: scripts/ensure-deps installs it")
        .to_str()
        .unwrap()
        .to_owned()
}

/// Now plus `offset`, in RFC 3339 (whole seconds), for a [`TestActivity`]'s times.
pub fn from_now(offset: chrono::Duration) -> &'static str {
    Box::leak(
        (chrono::Utc::now() + offset)
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            .into_boxed_str(),
    )
}

pub fn flashgate_bin() -> &'static str {
    env!("CARGO_BIN_EXE_flashgate")
}

impl GatewayProc {
    /// Starts the gateway and waits until `/readyz` answers 200.
    pub fn start(config: TestConfig) -> Self {
        Self::start_with_env(config, &[])
    }

    /// Starts the gateway with extra environment variables (e.g. a test fault point).
    pub fn start_with_env(config: TestConfig, env: &[(&str, &str)]) -> Self {
        let mut gw = Self::start_with_env_unready(config, env);
        gw.wait_ready();
        gw
    }

    /// Starts the gateway and returns once its proxy port takes connections, ready or not (as
    /// traffic reaches a process that took over its listeners, or an L4 balancer's).
    pub fn start_unready(config: TestConfig, env: &[(&str, &str)]) -> Self {
        let gw = Self::start_with_env_unready(config, env);
        let addr = gw.addr;
        wait_for(
            "the proxy port to take connections",
            STARTUP_DEADLINE,
            || std::net::TcpStream::connect(addr).ok().map(drop),
        );
        gw
    }

    fn start_with_env_unready(config: TestConfig, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut gw = GatewayProc {
            addr: format!("127.0.0.1:{}", config.listen_port).parse().unwrap(),
            admin: format!("127.0.0.1:{}", config.admin_port).parse().unwrap(),
            config,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            args: Vec::new(),
            dir,
            child: None,
        };
        gw.spawn();
        gw
    }

    /// Starts another gateway with `config` on ports of its own, its clock `offset` off
    /// (libfaketime's `FAKETIME`, e.g. `"+2h"`; monotonic time is left alone).
    pub fn start_skewed(config: &TestConfig, offset: &str) -> Self {
        let faketime = libfaketime();
        let mut config = config.clone();
        config.listen_port = free_port();
        config.admin_port = free_port();
        Self::start_with_env(
            config,
            &[
                ("LD_PRELOAD", faketime.as_str()),
                ("FAKETIME", offset),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ],
        )
    }

    /// Starts `serve --upgrade` with this gateway's configuration: the new process waits on the
    /// upgrade socket for this one's listeners (send this one SIGQUIT). Returns once the new
    /// process is waiting.
    pub fn start_upgrade(&self, upgrade_sock: &Path) -> GatewayProc {
        let _ = std::fs::remove_file(upgrade_sock);
        let mut gw = GatewayProc {
            addr: self.addr,
            admin: self.admin,
            config: self.config.clone(),
            env: self.env.clone(),
            args: vec!["--upgrade".into()],
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        gw.spawn();
        wait_for(
            "the new binary to wait on the upgrade socket",
            STARTUP_DEADLINE,
            || {
                if let Some(status) = gw.child.as_mut().unwrap().try_wait().unwrap() {
                    panic!("the new binary exited with {status}:\n{}", gw.logs());
                }
                upgrade_sock.exists().then_some(())
            },
        );
        gw
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.yaml")
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("gateway.log")
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) {
        std::fs::write(self.config_path(), self.config.to_yaml()).expect("write config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let child = Command::new(flashgate_bin())
            .arg("serve")
            .arg("--config")
            .arg(self.config_path())
            .args(&self.args)
            .env("FLASHGATE_SIGNING_SECRET", SIGNING_SECRET)
            .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("flashgate starts");
        self.child = Some(child);
    }

    fn wait_ready(&mut self) {
        let admin = self.admin;
        let end = Instant::now() + STARTUP_DEADLINE;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "flashgate exited with {status} during start-up:\n{}",
                    self.logs()
                );
            }
            // Ready (the store, the scripts, Redis's clock, the proxy's listener), and the proxy
            // port taking connections (services start one after another: the admin listener
            // answers before the proxy's is bound).
            // Up is enough when Redis's record refuses a configured activity (readiness then
            // says 503 with the refused ids: the tests that start so read it themselves).
            let ready = blocking_get(admin, "/readyz").is_ok_and(|r| {
                r.status == 200 || (r.status == 503 && r.text().contains("\"refused\""))
            });
            if ready && std::net::TcpStream::connect(self.addr).is_ok() {
                return;
            }
            assert!(
                Instant::now() < end,
                "flashgate never became ready:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child);
        }
    }

    /// Writes `config` to the running gateway's file (it reloads on change or SIGHUP).
    pub fn rewrite_config(&mut self, config: TestConfig) {
        self.config = config;
        std::fs::write(self.config_path(), self.config.to_yaml()).expect("write config");
    }

    /// Sends a signal (`kill -s NAME`) to the gateway process.
    pub fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill")
            .args(["-s", name, &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -s {name} {pid}");
    }

    /// Waits for the process to exit on its own; its exit status.
    pub fn wait_exit(&mut self, deadline: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        let status = wait_for("flashgate to exit", deadline, || child.try_wait().unwrap());
        self.child = None;
        status
    }

    /// Kills and starts again with the same configuration and ports.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_ready();
    }

    pub async fn buy(&self, activity: &str, user: &str, qty: Option<u32>) -> HttpResponse {
        let path = match qty {
            Some(q) => format!("/api/seckill/{activity}/buy?qty={q}"),
            None => format!("/api/seckill/{activity}/buy"),
        };
        request(self.addr, "POST", &path, &[("X-User-Id", user)]).await
    }

    /// A purchase with an `Idempotency-Key`.
    pub async fn buy_keyed(&self, activity: &str, user: &str, key: &str) -> HttpResponse {
        request(
            self.addr,
            "POST",
            &format!("/api/seckill/{activity}/buy"),
            &[("X-User-Id", user), ("Idempotency-Key", key)],
        )
        .await
    }

    /// The admin API's view of an activity (`/v1/activities/{id}`).
    pub async fn activity_view(&self, id: &str) -> Value {
        let resp = self.admin_get(&format!("/v1/activities/{id}")).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        resp.json()
    }

    pub async fn admin_get(&self, path: &str) -> HttpResponse {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        get(self.admin, path, &[("Authorization", auth.as_str())]).await
    }

    pub async fn admin_post(&self, path: &str) -> HttpResponse {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        request(
            self.admin,
            "POST",
            path,
            &[("Authorization", auth.as_str())],
        )
        .await
    }

    /// `POST path` on the admin API with a JSON `body`.
    pub async fn admin_post_json(&self, path: &str, body: &str) -> HttpResponse {
        let raw = format!(
            "POST {path} HTTP/1.1\r\nHost: flashgate.test\r\nConnection: close\r\n\
             Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        send_raw(self.admin, raw.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// `POST /v1/activities/{id}/restock` with `body`, and an `Idempotency-Key` if given.
    pub async fn restock(&self, id: &str, body: &str, key: Option<&str>) -> HttpResponse {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let mut raw = format!(
            "POST /v1/activities/{id}/restock HTTP/1.1\r\nHost: flashgate.test\r\n\
             Connection: close\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n",
            body.len()
        );
        if let Some(key) = key {
            raw.push_str(&format!("Idempotency-Key: {key}\r\n"));
        }
        raw.push_str("\r\n");
        raw.push_str(body);
        send_raw(self.admin, raw.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("restock {id}: {e}"))
    }

    /// `flashgate reconcile` against this gateway's configuration: (exit code, table).
    pub fn reconcile(&self) -> (i32, String) {
        let (code, out, err) = run_cli(
            &[
                "reconcile",
                "--config",
                self.config_path().to_str().unwrap(),
            ],
            // Only the configuration file and Redis: no secrets in the environment.
            &[],
        );
        (code, format!("{out}{err}"))
    }

    /// `flashgate reconcile --activity ACT --orders FILE` with `orders` (the jti of the backend's
    /// orders) in FILE, `--confirm-pending` if asked: (exit code, report).
    pub fn reconcile_orders(
        &self,
        activity: &str,
        orders: &[String],
        confirm_pending: bool,
    ) -> (i32, String) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("orders.txt");
        std::fs::write(&file, orders.join("\n")).unwrap();
        let config = self.config_path();
        let mut args = vec![
            "reconcile",
            "--config",
            config.to_str().unwrap(),
            "--activity",
            activity,
            "--orders",
            file.to_str().unwrap(),
        ];
        if confirm_pending {
            args.push("--confirm-pending");
        }
        let (code, out, err) = run_cli(&args, &[]);
        (code, format!("{out}{err}"))
    }

    /// Asserts that `flashgate reconcile` finds Redis clean (exit 0); its table.
    pub fn reconcile_clean(&self) -> String {
        let (code, table) = self.reconcile();
        assert_eq!(code, 0, "{table}");
        table
    }

    pub async fn metrics(&self) -> String {
        String::from_utf8(get(self.admin, "/metrics", &[]).await.body).unwrap()
    }

    /// The metrics once `ready` holds for them, polled: a request's counters move in its
    /// logging phase, just after its answer is sent. Panics with the last text after 5 s.
    pub async fn metrics_when(&self, ready: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let m = self.metrics().await;
            if ready(&m) || Instant::now() >= end {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The value of one series (name and labels as exported), if the gateway exports it.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics().await, series)
    }

    /// Polls until `series` is `want`; panics (naming it, with its last value) after 10 s.
    pub async fn wait_metric(&self, series: &str, want: f64) {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let last = self.metric(series).await;
            if last == Some(want) {
                return;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {series} to be {want}: it is {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until `series` is at least `min`; its value then. Panics (naming it, with its last
    /// value) after 10 s.
    pub async fn wait_metric_at_least(&self, series: &str, min: f64) -> f64 {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let last = self.metric(series).await;
            if let Some(v) = last.filter(|v| *v >= min) {
                return v;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {series} to reach {min}: it is {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the configuration generation `generation` (or a later one) runs: a reload
    /// applied (1 at start, +1 per applied reload). A later one counts: a file rewritten and
    /// then signalled may be applied twice (the file watcher, then SIGHUP).
    pub async fn wait_generation(&self, generation: u64) {
        let series = "flashgate_config_generation";
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let last = self.metric(series).await;
            if last.is_some_and(|g| g >= generation as f64) {
                return;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {series} to reach {generation}: it is {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Queue script calls this gateway completed (each waiting-room read, ticket and control):
    /// the count of `flashgate_redis_script_duration_seconds{script="queue"}`, failed calls too.
    pub async fn queue_calls(&self) -> u64 {
        self.metric(r#"flashgate_redis_script_duration_seconds_count{script="queue"}"#)
            .await
            .unwrap_or(0.0) as u64
    }

    /// Waits until this gateway has read its waiting room from Redis since this call, and
    /// learned what it read: three more queue script calls. Of the maintenance loop's reads
    /// (one queue at a time, each learned before the next starts) one may be under way now;
    /// the next two start after this call, and the third is not called before the second is
    /// learned. For a gateway with one queue and nothing else calling queue scripts meanwhile.
    pub async fn wait_queue_read(&self) {
        let before = self.queue_calls().await;
        wait_for_async(
            "the gateway to read its waiting room again",
            Duration::from_secs(10),
            || async { (self.queue_calls().await >= before + 3).then_some(()) },
        )
        .await;
    }

    /// Waits until this gateway's view of `activity`'s waiting room has the cursor start at
    /// `starts_at` (RFC 3339): Redis's queue was told a postponement, and the gateway read it
    /// (`flashgate_queue_start_time_seconds`).
    pub async fn wait_queue_start(&self, activity: &str, starts_at: &str) {
        let secs = chrono::DateTime::parse_from_rfc3339(starts_at)
            .expect("an RFC 3339 start")
            .timestamp();
        self.wait_metric(
            &format!(r#"flashgate_queue_start_time_seconds{{activity="{activity}"}}"#),
            secs as f64,
        )
        .await;
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        // A test that failed because the gateway was gone says how it went.
        let exited = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        self.kill();
        if std::thread::panicking() {
            if let Some(status) = exited {
                eprintln!("---- flashgate had exited before the test ended: {status} ----");
            }
            eprintln!("---- flashgate log ----\n{}", self.logs());
        }
    }
}

/// Runs `flashgate <args>` to completion: (exit code, stdout, stderr).
pub fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(flashgate_bin());
    cmd.args(args)
        .env_remove("FLASHGATE_SIGNING_SECRET")
        .env_remove("FLASHGATE_ADMIN_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_bounded(
        &format!("flashgate {}", args.join(" ")),
        &mut cmd,
        Duration::from_secs(60),
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

// ---------------------------------------------------------------- HTTP client

#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The reservation id a winner was told.
    pub fn reservation_id(&self) -> String {
        self.header("x-flashgate-reservation-id")
            .unwrap_or_else(|| {
                panic!(
                    "no reservation id: {} {}",
                    self.status,
                    String::from_utf8_lossy(&self.body)
                )
            })
            .to_owned()
    }

    /// The body as text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts the status and the contract's `code` of a gateway answer.
    #[track_caller]
    pub fn assert_answer(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.code().as_str()),
            (status, code),
            "{}",
            self.text()
        );
    }

    /// The contract's `code` field of a gateway answer.
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }
}

pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: flashgate.test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" || method == "PUT" {
        req.push_str("Content-Length: 0\r\n");
    }
    req.push_str("\r\n");
    req
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> HttpResponse {
    send_raw(addr, raw_request(method, path, headers).as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{method} {path} to {addr}: {e}"))
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    request(addr, "GET", path, headers).await
}

pub fn blocking_get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(raw_request("GET", path, &[]).as_bytes())?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub async fn send_raw(addr: SocketAddr, raw: &[u8]) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr).await?;
    send_on(&mut stream, raw).await
}

pub async fn send_on(stream: &mut TcpStream, raw: &[u8]) -> std::io::Result<HttpResponse> {
    stream.write_all(raw).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "response timed out"))??;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> std::io::Result<HttpResponse> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| bad("head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = buf[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_str = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_str.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// Opens one connection per request first, then sends all of them at the same instant, and
/// returns the responses in request order.
pub async fn burst(addr: SocketAddr, requests: Vec<String>) -> Vec<HttpResponse> {
    let n = requests.len();
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for raw in requests {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let connected = TcpStream::connect(addr).await;
            gate.wait().await;
            let mut stream = connected.expect("connect before the burst");
            send_on(&mut stream, raw.as_bytes())
                .await
                .expect("burst response")
        }));
    }
    gate.wait().await;
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// The value of the first series in Prometheus text `metrics` that starts with `series` (name
/// and labels as exported, e.g. `flashgate_config_reloads_total{result="applied"}`).
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Each reservation event of a segment's stream, in order, as (jti, type): a `reserve` or
/// `confirm` entry names a batch's reservations (`jti` joined by line breaks, in order), a
/// `release` one; other entries (late acceptances, restocks, recounts) are left out.
#[allow(dead_code)]
pub fn reservation_events(conn: &mut redis::Connection, stream: &str) -> Vec<(String, String)> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(conn)
        .unwrap();
    let mut out = Vec::new();
    for entry in reply.ids {
        let field = |name: &str| entry.get::<String>(name).unwrap_or_default();
        let kind = field("type");
        if matches!(kind.as_str(), "reserve" | "confirm" | "release") {
            for jti in field("jti").split('\n') {
                out.push((jti.to_owned(), kind.clone()));
            }
        }
    }
    out
}

/// `flashgate schema` as the binary prints it (tests/config.rs validates with it, tests/docs.rs
/// compares the committed copy and the reference's keys).
#[allow(dead_code)]
pub fn printed_schema_text() -> String {
    let out = run_bounded(
        "flashgate schema",
        Command::new(env!("CARGO_BIN_EXE_flashgate")).arg("schema"),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}
