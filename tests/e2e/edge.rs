//! The edge fails closed (issue 21), judged by a real router: an attack corpus sent through the
//! gateway to nginx (`proxy_pass` with a URI: it decodes, merges slashes and resolves dots, as
//! many shops run it) in front of a Flask shop (`tests/fixtures/edge/shop.py`) whose purchase
//! handler records every time it runs. A bypass is the handler running without a reservation,
//! or reading another quantity than the one reserved; no string comparison decides it.

use crate::support::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// The Flask shop (Debian's python3-flask), with at most `workers` requests handled at once.
struct Shop {
    addr: SocketAddr,
    child: Child,
}

impl Shop {
    fn start(workers: usize) -> Shop {
        Shop::started(workers, false)
    }

    /// The least careful shop: its purchase handler runs for any method, and it reads every
    /// path decoded once more (see `shop.py`'s `lenient`).
    fn lenient(workers: usize) -> Shop {
        Shop::started(workers, true)
    }

    fn started(workers: usize, lenient: bool) -> Shop {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new("/usr/bin/python3")
            .arg(repo_path("tests/fixtures/edge/shop.py"))
            .arg(addr.port().to_string())
            .arg(workers.to_string())
            .args(lenient.then_some("lenient"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the shop starts (Debian's python3-flask; scripts/ensure-deps installs it)");
        wait_for("the shop to listen", STARTUP_DEADLINE, || {
            std::net::TcpStream::connect(addr).ok()
        });
        Shop { addr, child }
    }

    /// Every run of the purchase handler so far.
    async fn purchases(&self) -> Vec<Value> {
        let resp = get(self.addr, "/__records", &[]).await;
        resp.json()["records"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx in front of the shop, normalising targets before `proxy_pass`: one process (no master),
/// so killing it leaves no worker behind.
struct Nginx {
    addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(backend: SocketAddr) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir(root.join(sub)).unwrap();
        }
        open_up(root);
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/error.log;\n\
             events {{ worker_connections 512; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {root}/body;\n  proxy_temp_path {root}/proxy;\n\
             \x20 fastcgi_temp_path {root}/fastcgi;\n  uwsgi_temp_path {root}/uwsgi;\n  scgi_temp_path {root}/scgi;\n\
             \x20 server {{\n    listen {addr};\n    location / {{ proxy_pass http://{backend}/; }}\n  }}\n}}\n",
            root = root.display()
        );
        let path = root.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts (Debian's nginx; scripts/ensure-deps installs it)");
        wait_for("nginx to listen", STARTUP_DEADLINE, || {
            std::net::TcpStream::connect(addr).ok()
        });
        Nginx {
            addr,
            child,
            _dir: dir,
        }
    }
}

/// nginx's workers run as another user when started by root: let them write their temp dirs.
fn open_up(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o777));
    }
    let _ = std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o777));
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway in front of `upstream` (the shop, or nginx before it), with a demo upstream only
/// for its configuration's sake replaced by `upstream`.
fn gateway(redis: &RedisServer, demo: &Upstream, upstream: SocketAddr) -> GatewayProc {
    let sale = TestActivity {
        per_user_limit: 10,
        max_per_request: 5,
        ..TestActivity::open("1001", 1000)
    };
    let mut config = TestConfig::new(redis, demo, vec![sale]);
    config.upstreams = vec![upstream];
    config.per_user = Some((1000, 1000));
    GatewayProc::start(config)
}

/// One attack: what it tries, its target, its headers and its body.
type Attack<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a [u8]);

/// A raw request: exactly this target, these headers, this body.
fn raw(method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_purchase_reaches_the_handler_unreserved_or_with_another_quantity() {
    let redis = RedisServer::start();
    let demo = Upstream::start();
    let shop = Shop::start(16);
    let nginx = Nginx::start(shop.addr);
    let gw = gateway(&redis, &demo, nginx.addr);
    let deep = format!(
        "{}{}/api/seckill/1001/buy",
        "/a".repeat(33),
        "/..".repeat(33)
    );
    let json = ("Content-Type", "application/json");
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let plain = ("Content-Type", "text/plain");
    let multipart = ("Content-Type", "multipart/form-data; boundary=XyZ");
    let multipart_body: &[u8] =
        b"--XyZ\r\nContent-Disposition: form-data; name=\"qty\"\r\n\r\n5\r\n--XyZ--\r\n";
    let corpus: Vec<Attack> = vec![
        (
            "control character then ..",
            "/x%0a/../api/seckill/1001/buy".into(),
            vec![],
            b"",
        ),
        (
            "not UTF-8 then ..",
            "/api/seckill/1001/x%ff/../buy".into(),
            vec![],
            b"",
        ),
        ("deeper than the cap", deep, vec![], b""),
        (
            "format suffix",
            "/api/seckill/1001/buy.json".into(),
            vec![],
            b"",
        ),
        (
            "front controller",
            "/index.php/api/seckill/1001/buy".into(),
            vec![],
            b"",
        ),
        (
            "double encoded",
            "/api/seckill/1001/bu%2579".into(),
            vec![],
            b"",
        ),
        (
            "trailing space",
            "/api/seckill/1001/buy%20".into(),
            vec![],
            b"",
        ),
        (
            "trailing tab",
            "/api/seckill/1001/buy%09".into(),
            vec![],
            b"",
        ),
        (
            "non-ASCII",
            "/api/seckill/1001/b%c3%bcy".into(),
            vec![],
            b"",
        ),
        (
            "network path",
            "//evil/api/seckill/1001/buy".into(),
            vec![],
            b"",
        ),
        // Decoded again by a proxy in between, `%252F` joins or splits segments.
        ("double-encoded slashes", "/api%252Fseckill%252F1001%252Fbuy".into(), vec![], b""),
        ("double-encoded slash", "/api/seckill%252F1001/buy".into(), vec![], b""),
        ("double-encoded backslash", "/api/seckill/1001%255Cbuy".into(), vec![], b""),
        (
            "indexed quantity",
            "/api/seckill/1001/buy?qty=1&qty[0]=5".into(),
            vec![],
            b"",
        ),
        (
            "encoded indexed quantity",
            "/api/seckill/1001/buy?qty%5B0%5D=5".into(),
            vec![],
            b"",
        ),
        (
            "semicolon",
            "/api/seckill/1001/buy?x=1;qty=5".into(),
            vec![],
            b"",
        ),
        (
            "NUL in the name",
            "/api/seckill/1001/buy?qty%00=5".into(),
            vec![],
            b"",
        ),
        (
            "multipart field",
            "/api/seckill/1001/buy".into(),
            vec![multipart],
            multipart_body,
        ),
        (
            "multipart with a decoy end",
            "/api/seckill/1001/buy".into(),
            vec![("Content-Type", "multipart/form-data; boundary=A")],
            b"--A\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi--A--\r\n--A\r\nContent-Disposition: form-data; name=\"qty\"\r\n\r\n5\r\n--A--\r\n",
        ),
        ("two body types", "/api/seckill/1001/buy".into(), vec![plain, form], b"qty=5"),
        (
            "JSON as text/plain",
            "/api/seckill/1001/buy".into(),
            vec![plain],
            br#"{"qty":5}"#,
        ),
        (
            "JSON with a BOM",
            "/api/seckill/1001/buy".into(),
            vec![json],
            b"\xEF\xBB\xBF{\"qty\": 5}",
        ),
        (
            "JSON after two BOMs",
            "/api/seckill/1001/buy".into(),
            vec![plain],
            b"\xEF\xBB\xBF\xEF\xBB\xBF{\"qty\":5}",
        ),
        ("JSON after a vertical tab", "/api/seckill/1001/buy".into(), vec![plain], b"\x0b{\"qty\":5}"),
        ("JSON after a no-break space", "/api/seckill/1001/buy".into(), vec![plain], b"\xC2\xA0{\"qty\":5}"),
        (
            "JSON NaN",
            "/api/seckill/1001/buy".into(),
            vec![json],
            br#"{"qty": NaN, "x": 1}"#,
        ),
        (
            "form semicolon",
            "/api/seckill/1001/buy".into(),
            vec![form],
            b"x=1;qty=5",
        ),
        (
            "address and URL claims",
            "/api/seckill/1001/buy".into(),
            vec![
                ("True-Client-IP", "1.2.3.4"),
                ("X-Client-IP", "1.2.3.4"),
                ("X-Forwarded-Host", "evil.test"),
                ("X-Forwarded-Proto", "https"),
                ("X-Original-URL", "/api/seckill/1001/buy"),
                ("X-HTTP-Method-Override", "POST"),
                ("Client-IP", "1.2.3.4"),
                ("X-Forwarded-Scheme", "https"),
                ("X-Original-URI", "/api/seckill/1001/buy"),
                ("X-Forwarded-User", "mallory"),
            ],
            b"",
        ),
        (
            "plain purchase",
            "/api/seckill/1001/buy?qty=2".into(),
            vec![],
            b"",
        ),
    ];
    let mut answers = Vec::new();
    for (i, (what, target, headers, body)) in corpus.iter().enumerate() {
        let user = format!("buyer-{i}");
        let mut headers = headers.clone();
        headers.push(("X-User-Id", user.as_str()));
        let resp = send_raw(gw.addr, &raw("POST", target, &headers, body))
            .await
            .unwrap();
        answers.push(format!("{what}: {}", resp.status));
    }
    // The one retry with another quantity is refused; it would carry the first one's claims.
    let keyed = |qty: &str| {
        raw(
            "POST",
            &format!("/api/seckill/1001/buy?qty={qty}"),
            &[("X-User-Id", "keyed"), ("Idempotency-Key", "k-1")],
            b"",
        )
    };
    assert_eq!(send_raw(gw.addr, &keyed("1")).await.unwrap().status, 200);
    let retry = send_raw(gw.addr, &keyed("3")).await.unwrap();
    assert_eq!(
        (retry.status, retry.code()),
        (400, "bad_request".to_owned()),
        "a keyed retry with another quantity"
    );
    let purchases = shop.purchases().await;
    let claims_qty = |p: &Value| p["claims"]["qty"].as_u64().map(|q| q.to_string());
    for p in &purchases {
        assert!(
            !p["claims"].is_null(),
            "the purchase handler ran without a reservation: {p}\n{answers:#?}"
        );
        if !p["qty"].is_null() {
            assert_eq!(
                p["qty"].as_str().map(str::to_owned),
                claims_qty(p),
                "the handler read another quantity than reserved: {p}\n{answers:#?}"
            );
        }
        for claim in flashgate::header_names::CLIENT_CLAIMS {
            assert!(
                p["headers"].get(claim).is_none(),
                "{claim} from an untrusted peer reached the backend: {p}"
            );
        }
    }
    // Admitted (and reserved as the gateway read them): `x=1;qty=5` (5 units, as a parser
    // splitting on `;` reads it), the one with claim headers (stripped), the plain purchase and
    // the first keyed one. Everything else was refused before the backend.
    assert_eq!(purchases.len(), 4, "{purchases:#?}\n{answers:#?}");
    let metrics = gw.metrics().await;
    for reason in ["control_character", "not_utf8", "too_deep", "look_alike"] {
        assert!(
            metric_value(
                &metrics,
                &format!("flashgate_edge_refusals_total{{reason=\"{reason}\"}}")
            )
            .is_some_and(|v| v >= 1.0),
            "{reason} counted"
        );
    }
    let logs = gw.logs();
    assert!(logs.contains("edge=\"look_alike\""), "{logs}");
}

/// A shop whose purchase handler runs for any method, behind a proxy that decodes the path once
/// more (and reads a decoded `?` or `#` as structure, after NFKC): no spelling and no method
/// runs it without a reservation. Spellings are refused 400, other methods 405 with `Allow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_or_method_reaches_a_lenient_shop_unreserved() {
    let redis = RedisServer::start();
    let demo = Upstream::start();
    let shop = Shop::lenient(8);
    let gw = gateway(&redis, &demo, shop.addr);
    let mut answers = Vec::new();
    for (i, target) in [
        "/api/seckill/1001/buy%3Fx=1",
        "/api/seckill/1001/buy%3F",
        "/api/seckill/1001/buy%23x",
        "/api/seckill/1001/buy%253Fx=1",
        "/api/seckill/1001/buy%25253Fx=1",
        "/api/seckill/1001/buy%EF%BC%9Fx=1",
        "/api/seckill/1001/buy%EF%BC%83x",
        "/api%EF%BC%8Fseckill%EF%BC%8F1001%EF%BC%8Fbuy",
        // From the adversarial pass: what IIS, .NET or Spring's suffix matching read as the
        // purchase, one more level of encoding, IIS's `%u`, and look-alikes on any method.
        "/api/seckill/1001/buy.",
        "/api/seckill/1001/buy%2e",
        "/api/seckill/1001/buy::$DATA",
        "/api/seckill/1001/buy%E2%80%8B",
        "/api/seckill/1001/buy%2525253Fx=1",
        "/api/seckill/1001/buy%u003Fx=1",
        "/api/seckill/1001/buy.json",
        "/index.php/api/seckill/1001/buy",
        // The second pass: any format after a dot, the dotless i, routing by the query.
        "/api/seckill/1001/buy.a.b",
        "/api/seck%C4%B1ll/1001/buy",
        "/index.php?/api/seckill/1001/buy",
    ]
    .iter()
    .enumerate()
    {
        for method in ["POST", "PUT", "GET"] {
            let user = format!("spelling-{i}-{method}");
            let req = raw(method, target, &[("X-User-Id", user.as_str())], b"");
            let resp = send_raw(gw.addr, &req).await.unwrap();
            assert_eq!(
                (resp.status, resp.code()),
                (400, "bad_request".to_owned()),
                "{method} {target}"
            );
            answers.push(format!("{method} {target}: {}", resp.status));
        }
    }
    for method in ["PUT", "GET", "DELETE", "PATCH"] {
        let req = raw(method, "/api/seckill/1001/buy", &[("X-User-Id", "m")], b"");
        let resp = send_raw(gw.addr, &req).await.unwrap();
        assert_eq!(resp.status, 405, "{method}");
        assert_eq!(resp.code(), "method_not_allowed", "{method}");
        assert_eq!(resp.header("allow"), Some("POST"), "{method}");
        answers.push(format!("{method}: {}", resp.status));
    }
    // The shop's purchase handler never ran; a real purchase still does, reserved.
    assert!(shop.purchases().await.is_empty(), "{answers:#?}");
    let buy = raw(
        "POST",
        "/api/seckill/1001/buy",
        &[("X-User-Id", "real")],
        b"",
    );
    assert_eq!(send_raw(gw.addr, &buy).await.unwrap().status, 200);
    let purchases = shop.purchases().await;
    assert_eq!(purchases.len(), 1, "{purchases:#?}");
    assert!(!purchases[0]["claims"].is_null(), "{purchases:#?}");
    let metrics = gw.metrics().await;
    let wrong = r#"flashgate_edge_refusals_total{reason="wrong_method"}"#;
    assert_eq!(metric_value(&metrics, wrong), Some(4.0));
}

/// Targets that are not sale routes reach the backend in the form the gateway read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_routes_are_forwarded_as_the_gateway_read_them() {
    let redis = RedisServer::start();
    let demo = Upstream::start();
    let gw = gateway(&redis, &demo, demo.addr);
    for (target, forwarded) in [
        ("/static/../shop//item?id=1", "/shop/item"),
        ("/admin/", "/admin/"),
        ("/a%2Fb", "/a/b"),
        ("/a;jsessionid=1/b", "/a/b"),
    ] {
        let resp = send_raw(gw.addr, &raw("GET", target, &[], b""))
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{target}");
        let seen = demo.requests().await;
        let last = seen.last().unwrap();
        assert_eq!(last["path"], forwarded, "{target}");
    }
    let unreadable = send_raw(gw.addr, &raw("GET", "/static/%ff", &[], b""))
        .await
        .unwrap();
    assert_eq!(unreadable.status, 400, "refused, not passed through");
}

/// 200 connections trickle a body to another route, a byte every half second: the gateway
/// holds them (the backend never sees a request before its body is whole), so a backend of
/// eight workers still answers real buyers in normal time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_on_other_routes_hold_no_backend_worker() {
    let redis = RedisServer::start();
    let demo = Upstream::start();
    let shop = Shop::start(8);
    let gw = gateway(&redis, &demo, shop.addr);
    let buyers = |round: usize| async move {
        let mut took = Vec::new();
        for batch in 0..10 {
            let started = Instant::now();
            let requests = (0..10)
                .map(|i| {
                    raw_request(
                        "POST",
                        "/api/seckill/1001/buy",
                        &[("X-User-Id", &format!("r{round}-{batch}-{i}"))],
                    )
                })
                .collect();
            for resp in burst(gw.addr, requests).await {
                assert_eq!(resp.status, 200, "{}", resp.text());
            }
            took.push(started.elapsed());
        }
        took.sort();
        took[took.len() * 99 / 100 - 1]
    };
    let quiet = buyers(0).await;
    // The attack: each connection sends its headers and a first byte, then a byte every 0.5 s.
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"POST /upload HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 100000\r\n\r\nx")
            .await
            .unwrap();
        slow.push(s);
    }
    let rounds = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let trickle = tokio::spawn({
        let rounds = rounds.clone();
        async move {
            for _ in 0..40 {
                // The attacker's pace (a slow client on purpose), not a wait for anything.
                tokio::time::sleep(Duration::from_millis(500)).await;
                for s in &mut slow {
                    let _ = s.write_all(b"x").await;
                }
                rounds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    // The trickle is under way before the buyers come: every connection sent a byte of its
    // body since its headers, and the gateway took them all in (a request on a new connection
    // is answered once the connections queued before it were accepted).
    wait_for_async(
        "the trickle's first round",
        Duration::from_secs(10),
        || async { (rounds.load(std::sync::atomic::Ordering::SeqCst) >= 1).then_some(()) },
    )
    .await;
    let probe = get(gw.addr, "/catalog", &[]).await;
    assert_eq!(probe.status, 200, "{}", probe.text());
    let attacked = buyers(1).await;
    trickle.abort();
    let floor = Duration::from_millis(20);
    assert!(
        attacked <= quiet.max(floor) * 2,
        "buyers' p99 under the slow-body attack {attacked:?} vs quiet {quiet:?}"
    );
    eprintln!("FIGURES slow-body attack: p99 of a batch of 10 buyers quiet {quiet:?}, attacked {attacked:?}");
}

/// A poll is a buyer: without a ticket it spends from the buyer's bucket, and after the first
/// one (which has Redis issue the ticket) it is answered without Redis: with Redis paused, the
/// next ticketless poll is still answered at once, from the ticket remembered and the queue's
/// state as last read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_are_rate_limited_and_answered_without_redis_after_the_first() {
    let redis = RedisServer::start();
    let demo = Upstream::start();
    let sale = TestActivity {
        queue: Some(Queue::admit(1)),
        ..TestActivity::open("q1", 100)
    };
    let mut config = TestConfig::new(&redis, &demo, vec![sale]);
    config.per_user = Some((5, 5));
    let gw = GatewayProc::start(config);
    let poll = || get(gw.addr, "/flashgate/queue/q1", &[("X-User-Id", "poller")]);
    let first = poll().await;
    assert_eq!(first.status, 200, "the first poll issues a ticket");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("ALL")
        .query(&mut redis.conn())
        .unwrap();
    let started = Instant::now();
    let again = poll().await;
    assert_eq!(again.status, 200);
    assert_eq!(
        again.json()["ticket"],
        first.json()["ticket"],
        "the same place"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "answered without waiting for Redis: {:?}",
        started.elapsed()
    );
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(poll().await.status);
    }
    assert!(statuses.contains(&429), "the buyer's bucket: {statuses:?}");
}

/// Other routes' bodies are held against one budget over every connection (a body past it gets
/// 503: many large bodies cannot exhaust the gateway's memory), and a backend slot for another
/// route is taken only once the request is ready to go (slow bodies hold none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_bodies_have_one_budget_and_take_a_backend_slot_only_when_whole() {
    let redis = RedisServer::start();
    let demo = Upstream::start();
    let mut config = TestConfig::new(&redis, &demo, vec![TestActivity::open("1001", 10)]);
    config = config.passthrough_body_bytes(65536, 98304);
    config = config.max_passthrough_inflight(2);
    let gw = GatewayProc::start(config);
    // Two slow uploads, 60 KiB announced, 50 KiB sent each: 100 KiB would be held, past the
    // 96 KiB budget; whichever the gateway reads second is told 503 (the other keeps waiting).
    let mut uploads = Vec::new();
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"POST /upload HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 61440\r\n\r\n")
            .await
            .unwrap();
        let _ = s.write_all(&vec![b'x'; 51200]).await;
        uploads.push(tokio::spawn(async move {
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::io::AsyncReadExt::read_to_end(&mut s, &mut answer),
            )
            .await;
            (String::from_utf8_lossy(&answer).into_owned(), s)
        }));
    }
    let mut answers = Vec::new();
    let mut held = Vec::new();
    for u in uploads {
        let (answer, stream) = u.await.unwrap();
        answers.push(answer);
        held.push(stream);
    }
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.starts_with("HTTP/1.1 503"))
            .count(),
        1,
        "{answers:?}"
    );
    // Slow bodies hold no backend slot: other routes still get through (two slots).
    for _ in 0..3 {
        let resp = send_raw(gw.addr, &raw("GET", "/product/1", &[], b""))
            .await
            .unwrap();
        assert_eq!(resp.status, 200);
    }
    drop(held);
}
