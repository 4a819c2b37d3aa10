//! The flashgate binary as a child process: start, admin calls, buyers, the CLI.

use super::*;

pub const SIGNING_SECRET: &str = "test-signing-secret-0123456789abcdef";
pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(30);

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

    /// `flashgate report --activity ACT` with `extra` arguments, on this gateway's
    /// configuration: (exit code, stdout, stderr).
    pub fn report(&self, activity: &str, extra: &[&str]) -> (i32, String, String) {
        let config = self.config_path();
        let mut args = vec![
            "report",
            "--config",
            config.to_str().unwrap(),
            "--activity",
            activity,
        ];
        args.extend_from_slice(extra);
        run_cli(&args, &[])
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
