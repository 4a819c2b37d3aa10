//! The waiting page in a real headless browser (Debian's chromium, driven over WebDriver by
//! chromedriver): a buyer's "buy" form lands on the page, which shows the place, polls by
//! itself, and at the buyer's turn submits the purchase, which the backend receives with the
//! signed reservation.

use crate::support::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const IDENTITY_SECRET: &str = "identity-secret-for-the-browser";

fn token(user: &str) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("idp1".into());
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    jsonwebtoken::encode(
        &header,
        &json!({ "sub": user, "exp": exp }),
        &EncodingKey::from_secret(IDENTITY_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// chromedriver on a free port, with one headless chromium session; both killed on drop.
struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (scripts/ensure-deps installs chromium-driver)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: tempfile::tempdir().unwrap(),
        };
        wait_for_async(
            "chromedriver to listen",
            Duration::from_secs(20),
            || async { tokio::net::TcpStream::connect(addr).await.ok().map(|_| ()) },
        )
        .await;
        let profile = browser._profile.path().display().to_string();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--disable-background-networking",
                         "--disable-extensions", "--no-first-run",
                         format!("--user-data-dir={profile}")]
            }
        }}});
        let created = browser.call("POST", "/session", Some(caps)).await;
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        browser
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let (status, body) =
            tokio::time::timeout(Duration::from_secs(60), exchange(self.addr, &raw))
                .await
                .expect("chromedriver answers within a minute");
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert!(status < 300, "{method} {path}: {status} {v}");
        v["value"].clone()
    }

    async fn command(&self, method: &str, what: &str, body: Value) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        self.call(method, &path, Some(body)).await
    }

    async fn go(&self, url: &str) {
        self.command("POST", "url", json!({ "url": url })).await;
    }

    async fn script(&self, script: &str) -> Value {
        self.command(
            "POST",
            "execute/sync",
            json!({ "script": script, "args": [] }),
        )
        .await
    }
}

/// One request to chromedriver, read by its Content-Length (chromedriver says
/// `Connection: close` but keeps the connection open).
async fn exchange(addr: SocketAddr, raw: &str) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(raw.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let status = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                return (status, buf[end + 4..end + 4 + length].to_vec());
            }
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "chromedriver closed before answering");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The purchases the backend received (the product page's own request aside).
async fn purchases(upstream: &Upstream) -> Vec<Value> {
    let mut requests = upstream.requests().await;
    requests.retain(|r| {
        r["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/api/seckill/"))
    });
    requests
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The gateway in front of the demo backend, buyers identified by a session cookie (a JWT);
/// the queue (of activity 1001) stands still while the page is looked at.
async fn browser_stack(activity: TestActivity) -> (RedisServer, Upstream, GatewayProc) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = TestConfig::new(&redis, &upstream, vec![activity]);
    config = config.jwt_identity(Jwt::session_cookie());
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/pause")
            .await
            .status,
        200
    );
    (redis, upstream, gw)
}

/// Alice signs in on the shop (her session cookie) and presses "buy" on its product page.
async fn alice_presses_buy(gw: &GatewayProc) -> Browser {
    let browser = Browser::start().await;
    let origin = format!("http://{}", gw.addr);
    browser.go(&format!("{origin}/product")).await;
    browser
        .command(
            "POST",
            "cookie",
            json!({"cookie": {"name": "session", "value": token("alice"), "path": "/"}}),
        )
        .await;
    browser
        .script(
            "var f = document.createElement('form'); f.method = 'POST'; \
             f.action = '/api/seckill/1001/buy'; document.body.appendChild(f); f.submit();",
        )
        .await;
    browser
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_shows_the_place_refreshes_and_lands_on_the_purchase() {
    let (_redis, upstream, gw) = browser_stack(TestActivity {
        queue: Some(Queue::admit(1).window_secs(60)),
        ..TestActivity::open("1001", 5)
    })
    .await;
    // Bob is ahead of alice.
    let bob = request(
        gw.addr,
        "POST",
        "/api/seckill/1001/buy",
        &[("Authorization", &format!("Bearer {}", token("bob")))],
    )
    .await;
    assert_eq!(bob.status, 202);

    let browser = alice_presses_buy(&gw).await;
    let read = "return [document.body ? document.body.getAttribute('data-state') : null, \
                document.getElementById('position') ? \
                document.getElementById('position').textContent : null, \
                document.title, location.pathname, document.body ? document.body.innerText : ''];";
    // The page: alice's place, second in line.
    let shown = wait_for_async("the waiting page", Duration::from_secs(20), || async {
        let v = browser.script(read).await;
        (v[0] == "waiting" && v[1] == "#2").then_some(v)
    })
    .await;
    assert_eq!(shown[2], "In the queue", "{shown}");
    assert!(
        shown[4]
            .as_str()
            .unwrap()
            .contains("you are number 2 in the queue"),
        "{shown}"
    );
    // It asks again by itself (polls counted by the gateway), staying on the page.
    let polls = |m: &str| -> u64 {
        m.lines()
            .find(|l| l.starts_with("flashgate_queue_polls_total{activity=\"1001\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    let before = polls(&gw.metrics().await);
    wait_for_async(
        "the page to poll twice",
        Duration::from_secs(15),
        || async { (polls(&gw.metrics().await) >= before + 2).then_some(()) },
    )
    .await;
    assert_eq!(browser.script(read).await[0], "waiting");
    assert!(purchases(&upstream).await.is_empty(), "nothing bought yet");
    // The queue moves: bob's turn, then alice's; the page submits her purchase itself.
    assert_eq!(
        gw.admin_post("/v1/activities/1001/queue/resume")
            .await
            .status,
        200
    );
    let landed = wait_for_async("the purchase to land", Duration::from_secs(30), || async {
        let requests = purchases(&upstream).await;
        (!requests.is_empty()).then_some(requests)
    })
    .await;
    assert_eq!(landed.len(), 1, "{landed:?}");
    let text = landed[0].to_string();
    assert!(text.contains("/api/seckill/1001/buy"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("x-flashgate-reservation"),
        "{text}"
    );
    let after = wait_for_async(
        "the browser to show the backend's answer",
        Duration::from_secs(15),
        || async {
            let v = browser.script(read).await;
            (v[3] == "/api/seckill/1001/buy" && v[0].is_null()).then_some(v)
        },
    )
    .await;
    assert!(
        !after[4].as_str().unwrap().contains("In the queue"),
        "{after}"
    );
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;
}

/// With a challenge, the page a browser lands on solves the proof of work in a Web Worker
/// (progress shown), sends the solution, gets its ticket (the cookie) and goes on to the
/// waiting page with its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_challenge_page_solves_the_proof_of_work_and_gets_a_ticket() {
    let (redis, _upstream, gw) = browser_stack(TestActivity {
        queue: Some(
            Queue::admit(1)
                .window_secs(60)
                .challenge(json!({ "max_number": 300_000 })),
        ),
        ..TestActivity::open("1001", 5)
    })
    .await;
    let browser = alice_presses_buy(&gw).await;
    let read = "return [document.body ? document.body.getAttribute('data-state') : null, \
                document.getElementById('position') ? \
                document.getElementById('position').textContent : null, \
                location.pathname, sessionStorage.getItem('flashgate-challenge-progress')];";
    let shown = wait_for_async(
        "the waiting page after the challenge",
        Duration::from_secs(60),
        || async {
            let v = browser.script(read).await;
            (v[0] == "waiting" && v[1] == "#1").then_some(v)
        },
    )
    .await;
    assert_eq!(shown[2], "/flashgate/queue/1001", "{shown}");
    let m = gw.metrics().await;
    for (outcome, n) in [("issued", 1), ("solved", 1), ("refused", 0)] {
        let series = format!(
            "flashgate_queue_challenges_total{{activity=\"1001\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(m.contains(&series), "{series} in {m}");
    }
    // The ticket is the browser's (its cookie), one in Redis.
    let tickets: u64 = redis::cmd("HLEN")
        .arg("fg:{1001}:q:tickets")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(tickets, 1);
    // The worker reported its progress to the page as it went.
    assert!(shown[3].as_str().is_some(), "no progress shown: {shown}");
    eprintln!("progress shown up to {}%", shown[3]);
    let _ = browser
        .call("DELETE", &format!("/session/{}", browser.session), None)
        .await;
}
