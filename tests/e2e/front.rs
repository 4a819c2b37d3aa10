//! The front (issue 23): refusals the gateway decides alone are written before any Pingora
//! session, everything else is handed to the proxy, on the same keep-alive connection, in
//! order, each request answered and counted exactly once.

use crate::support::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A purchase on a kept-alive connection (no `Connection: close`), with extra header lines.
fn buy(activity: &str, user: &str, extra: &str) -> String {
    format!(
        "POST /api/seckill/{activity}/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: {user}\r\n{extra}Content-Length: 0\r\n\r\n"
    )
}

/// Reads one answer framed by its Content-Length off a kept-alive connection: its status,
/// headers and body. Fails on anything else (every answer on a sale route has a length).
async fn read_one(stream: &mut TcpStream, pending: &mut Vec<u8>) -> HttpResponse {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_string();
            let len: usize = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.trim().parse().expect("a length"))
                .expect("every answer here has a Content-Length");
            if pending.len() >= end + 4 + len {
                let rest = pending.split_off(end + 4 + len);
                let whole = std::mem::replace(pending, rest);
                return parse_response(&whole).expect("an HTTP answer");
            }
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, stream.read(&mut chunk))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "the gateway closed the connection before answering");
        pending.extend_from_slice(&chunk[..n]);
    }
}

fn decisions(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("flashgate_admission_decisions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_front_answers_and_proxied_purchases_in_order() {
    let (redis, upstream, gw) = Stack::start(vec![
        TestActivity::open("1001", 5),
        TestActivity::open("2002", 0),
    ])
    .parts();
    let before = decisions(&gw.metrics().await);
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut pending = Vec::new();
    // (request, status, code): a winner (handed over), the same buyer again (the reserve
    // script refuses: answered by the front), a sold-out sale (the cache, once learned), a
    // purchase with a body and one from a browser (both handed over undecided), a route that
    // is not a sale (the proxy's), and an unknown sale.
    let steps: Vec<(String, u16, &str)> = vec![
        (buy("1001", "ann", ""), 200, ""),
        (buy("1001", "ann", ""), 409, "limit_exceeded"),
        (buy("2002", "bob", ""), 410, "sold_out"),
        (buy("2002", "cat", ""), 410, "sold_out"),
        (
            "POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: dan\r\nContent-Length: 2\r\n\r\n{}".to_owned(),
            200,
            "",
        ),
        (buy("2002", "eve", "Accept: text/html\r\n"), 410, ""),
        (buy("9999", "fay", ""), 404, "unknown_activity"),
        (buy("1001", "gus", ""), 200, ""),
    ];
    for (i, (raw, status, code)) in steps.iter().enumerate() {
        s.write_all(raw.as_bytes()).await.unwrap();
        let resp = read_one(&mut s, &mut pending).await;
        assert_eq!(resp.status, *status, "step {i}: {}", resp.text());
        if !code.is_empty() {
            assert_eq!(resp.code(), *code, "step {i}");
        }
    }
    assert!(pending.is_empty(), "nothing but the answers came back");
    // Every sale request counted once, whichever reader answered it (the browser's too).
    let metrics = gw.metrics_when(|m| decisions(m) >= before + 8.0).await;
    assert_eq!(decisions(&metrics), before + 8.0, "{metrics}");
    let forwarded = upstream.requests().await;
    assert_eq!(
        forwarded.len(),
        3,
        "the three winners reached the backend once each"
    );
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(2));
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_and_split_heads_are_each_answered_once() {
    let (_redis, upstream, gw) = Stack::start(vec![
        TestActivity::open("1001", 5),
        TestActivity::open("2002", 0),
    ])
    .parts();
    // Learn the sold-out mark, then three requests in one write: refusal, winner, refusal.
    gw.buy("2002", "warm", None)
        .await
        .assert_answer(410, "sold_out");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut pending = Vec::new();
    let three = format!(
        "{}{}{}",
        buy("2002", "a", ""),
        buy("1001", "b", ""),
        buy("2002", "c", "")
    );
    s.write_all(three.as_bytes()).await.unwrap();
    let first = read_one(&mut s, &mut pending).await;
    first.assert_answer(410, "sold_out");
    let second = read_one(&mut s, &mut pending).await;
    assert_eq!(second.status, 200, "{}", second.text());
    read_one(&mut s, &mut pending)
        .await
        .assert_answer(410, "sold_out");
    // A head split across writes (a byte at a time at first) is read whole.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut pending = Vec::new();
    let raw = buy("2002", "slowpoke", "");
    for b in raw.as_bytes()[..10].iter() {
        s.write_all(&[*b]).await.unwrap();
        s.flush().await.unwrap();
    }
    s.write_all(&raw.as_bytes()[10..]).await.unwrap();
    read_one(&mut s, &mut pending)
        .await
        .assert_answer(410, "sold_out");
    assert_eq!(upstream.requests().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_from_the_front_matches_the_proxys_answer() {
    let (_redis, _upstream, gw) = Stack::start(vec![TestActivity::open("2002", 0)]).parts();
    gw.buy("2002", "warm", None)
        .await
        .assert_answer(410, "sold_out");
    // The same refusal, by the front (plain) and by the proxy (a body makes it the proxy's).
    let front = send_raw(
        gw.addr,
        buy("2002", "p1", "Connection: close\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let proxied = send_raw(
        gw.addr,
        b"POST /api/seckill/2002/buy HTTP/1.1\r\nHost: x\r\nX-User-Id: p2\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    for resp in [&front, &proxied] {
        resp.assert_answer(410, "sold_out");
        assert_eq!(resp.header("content-type"), Some("application/json"));
        assert_eq!(resp.header("cache-control"), Some("no-store"));
        assert_eq!(resp.header("vary"), Some("Accept, Accept-Language"));
        assert!(resp.header("date").is_some());
    }
    assert_eq!(front.body, proxied.body);
    // In Chinese when asked, from the front too.
    let zh = send_raw(
        gw.addr,
        buy(
            "2002",
            "p3",
            "Connection: close\r\nAccept-Language: zh-CN\r\n",
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    zh.assert_answer(410, "sold_out");
    assert_ne!(zh.json()["message"], front.json()["message"]);
}

/// A head Pingora refuses when it reads it (two `Host`s, userinfo, an absolute-form target
/// whose authority is not the `Host`) is never judged by the front: no unit is taken for it.
/// (Review finding: each of these reserved a unit the proxy then never carried on, held until
/// its hold expired.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_pingora_refuses_takes_nothing() {
    let (redis, upstream, gw) = Stack::start(vec![TestActivity::open("1001", 5)]).parts();
    for (i, head) in [
        "POST /api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\nHost: x\r\n",
        "POST /api/seckill/1001/buy HTTP/1.1\r\nHost: u@x\r\n",
        "POST http://shop.example/api/seckill/1001/buy HTTP/1.1\r\nHost: other.example\r\n",
        "POST http://a@x/api/seckill/1001/buy HTTP/1.1\r\nHost: x\r\n",
    ]
    .iter()
    .enumerate()
    {
        let raw = format!("{head}X-User-Id: odd-{i}\r\nConnection: close\r\n\r\n");
        let resp = send_raw(gw.addr, raw.as_bytes()).await.unwrap();
        assert_eq!(resp.status, 400, "{head:?}: {}", resp.text());
        assert_eq!(redis.held("1001", &format!("odd-{i}")), None, "{head:?}");
    }
    // The same buyers, asking properly, are not over any limit.
    gw.buy("1001", "odd-0", None).await.assert_answer(200, "");
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(4));
    assert_eq!(upstream.requests().await.len(), 1);
    gw.reconcile_clean();
}

/// With CORS on, every answer on a sale route varies on `Origin`, whichever reader judged the
/// purchase: the front's refusals, and winners and queue answers it handed to the proxy
/// (review finding: those lost `Vary: Origin`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_cors_on_every_answer_varies_on_origin() {
    let (_redis, _upstream, gw) = Stack::start_with(
        vec![TestActivity::open("1001", 5), TestActivity::open("2002", 0)],
        |c| c.cors_origins(&["https://shop.example"]),
    )
    .parts();
    let won = gw.buy("1001", "v1", None).await;
    let refused = gw.buy("1001", "v1", None).await;
    let gone = gw.buy("2002", "v2", None).await;
    for (what, resp, status) in [
        ("won", &won, 200),
        ("refused", &refused, 409),
        ("gone", &gone, 410),
    ] {
        assert_eq!(resp.status, status, "{what}: {}", resp.text());
        let varies = resp
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("vary"))
            .any(|(_, v)| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("origin"))
            });
        assert!(varies, "{what}: {:?}", resp.headers);
    }
}

/// A backend that answers each purchase with the next scripted answer (raw bytes), on kept
/// connections, and counts what it got.
struct Scripted {
    addr: std::net::SocketAddr,
    got: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Stray bytes sent after an answer, so far.
    strays: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

impl Scripted {
    async fn start(answers: Vec<&'static [u8]>) -> Scripted {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = std::sync::Arc::new(AtomicUsize::new(0));
        let strays = std::sync::Arc::new(AtomicUsize::new(0));
        let answers = std::sync::Arc::new(answers);
        let (counter, strays_seen) = (got.clone(), strays.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (answers, counter) = (answers.clone(), counter.clone());
                let strays = strays_seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let n = counter.fetch_add(1, Ordering::SeqCst);
                            let answer = answers[n.min(answers.len() - 1)];
                            // `LATE` splits an answer from bytes the backend sends after it
                            // (a stray answer on an idle connection), 100 ms later: its pace.
                            let (now, late) = match answer.windows(6).position(|w| w == b"\0LATE\0")
                            {
                                Some(at) => (&answer[..at], Some(&answer[at + 6..])),
                                None => (answer, None),
                            };
                            if conn.write_all(now).await.is_err() {
                                return;
                            }
                            if let Some(late) = late {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                let _ = conn.write_all(late).await;
                                strays.fetch_add(1, Ordering::SeqCst);
                            }
                            if !answer
                                .windows(17)
                                .any(|w| w.eq_ignore_ascii_case(b"connection: close"))
                            {
                                continue;
                            }
                            return;
                        }
                        let mut chunk = [0u8; 4096];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        Scripted {
            addr,
            got,
            strays,
            _task: task,
        }
    }
}

/// The front's own exchange relays the backend's answer however the backend framed it (a
/// length, chunks, until it closes), settles each by its status, and keeps the buyer's
/// connection wherever the framing allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fronts_exchange_relays_every_framing_and_settles_by_status() {
    let backend = Scripted::start(vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Shop: a\r\n\r\n{\"order\":1}",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"or\r\n7\r\nder\":2}\r\n0\r\n\r\n",
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"order\":4}",
    ])
    .await;
    let (redis, _upstream, mut config) = backends(vec![TestActivity::open("1001", 10)]);
    config.upstreams = vec![backend.addr];
    let gw = GatewayProc::start(config);
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut pending = Vec::new();
    // A length, relayed with the backend's own header and the reservation's id.
    s.write_all(buy("1001", "w1", "").as_bytes()).await.unwrap();
    let first = read_one(&mut s, &mut pending).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, b"{\"order\":1}");
    assert_eq!(first.header("x-shop"), Some("a"));
    assert!(first.header("x-flashgate-reservation-id").is_some());
    // Chunks after a 100: relayed chunked on the same connection, read here whole.
    s.write_all(buy("1001", "w2", "").as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    while !raw.ends_with(b"0\r\n\r\n") {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("the chunked answer in time")
            .unwrap();
        assert!(
            n > 0,
            "closed mid-answer: {}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{text}"
    );
    // A 5xx gives the unit back and the buyer is told to retry.
    s.write_all(buy("1001", "w3", "").as_bytes()).await.unwrap();
    read_one(&mut s, &mut pending)
        .await
        .assert_answer(503, "unavailable");
    assert_eq!(redis.held("1001", "w3"), None);
    // Until the backend closes: relayed, then the buyer's connection closes too.
    s.write_all(buy("1001", "w4", "").as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("the close-delimited answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&rest).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("{\"order\":4}"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert_eq!(backend.got.load(std::sync::atomic::Ordering::SeqCst), 4);
    // Three sold (w1, w2, w4), one given back; all pending (`confirm: upstream` confirms them).
    gw.reconcile_clean();
    assert_eq!(redis.get_int("fg:{1001}:v1:stock"), Some(7));
}

/// A backend that writes more after its answer (a late 503 on the idle connection) never
/// answers the next buyer with it: that connection is not used again, the next buyer gets its
/// own answer and its unit is settled on it. (Review finding: the stray 503 released the next
/// buyer's unit, which the backend had sold, and every answer after it on that connection was
/// the previous buyer's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_bytes_from_an_idle_backend_connection_answer_nobody() {
    let backend = Scripted::start(vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"order\":1}\0LATE\0HTTP/1.1 503 X\r\nContent-Length: 7\r\n\r\n{stale}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"order\":2}",
    ])
    .await;
    let (redis, _upstream, mut config) = backends(vec![TestActivity::open("1001", 10)]);
    config.upstreams = vec![backend.addr];
    // One worker thread: the second purchase is sent from the same idle list the first
    // answer's connection went back to.
    config.server.threads = Some(1);
    let gw = GatewayProc::start(config);
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut pending = Vec::new();
    s.write_all(buy("1001", "first", "").as_bytes())
        .await
        .unwrap();
    let first = read_one(&mut s, &mut pending).await;
    assert_eq!(first.body, b"{\"order\":1}");
    wait_for_async(
        "the stray bytes to be sent",
        Duration::from_secs(10),
        || async { (backend.strays.load(std::sync::atomic::Ordering::SeqCst) > 0).then_some(()) },
    )
    .await;
    s.write_all(buy("1001", "second", "").as_bytes())
        .await
        .unwrap();
    let second = read_one(&mut s, &mut pending).await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.body, b"{\"order\":2}");
    assert_eq!(
        redis.held("1001", "second"),
        Some(1),
        "the second buyer's unit stays sold"
    );
    gw.reconcile_clean();
}
