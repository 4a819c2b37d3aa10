//! A private redis-server (and Redis Cluster) per test, on free ports in temp dirs.

use super::*;

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
