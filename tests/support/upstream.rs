//! The demo upstream (the shop's backend) and the stack of backends a gateway needs.

use super::*;

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
