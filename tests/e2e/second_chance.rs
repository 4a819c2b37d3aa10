//! The second chance, against the real gateway and redis-server: after a sell-out, buyers told
//! `sold_out` join the line; units that come back (a backend failure, an admin release, a
//! restock) go to the line's buyers in order, each held for the window, while a script
//! hammering the sale route gets none; a holder who lets the window pass hands the unit on.

use crate::support::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BUY: &str = "/api/seckill/4001/buy";
const LINE: &str = "/flashgate/line/4001";

async fn buy(gw: &GatewayProc, user: &str, ticket: Option<&str>) -> HttpResponse {
    let mut headers = vec![("X-User-Id", user)];
    headers.extend(ticket.map(|t| ("X-Flashgate-Ticket", t)));
    request(gw.addr, "POST", BUY, &headers).await
}

async fn line(gw: &GatewayProc, method: &str, user: &str) -> HttpResponse {
    request(gw.addr, method, LINE, &[("X-User-Id", user)]).await
}

/// Polls `user`'s place until a unit is held for them.
async fn their_turn(gw: &GatewayProc, user: &str) -> Value {
    wait_for_async(
        &format!("{user}'s turn"),
        Duration::from_secs(15),
        || async {
            let r = line(gw, "GET", user).await;
            (r.status == 200 && r.json()["code"] == "your_turn").then(|| r.json())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_units_go_to_the_line_in_order_and_never_to_a_script() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sale = TestActivity::explicit("4001", 2, 300).limit(1);
    let mut config = TestConfig::new(&redis, &upstream, vec![sale])
        .set("/activities/0/second_chance", json!({"window_secs": 3}));
    config.per_user = None;
    let gw = GatewayProc::start(config);

    // Two winners: the second one's backend is slow and will fail.
    let w1 = buy(&gw, "w1", None).await;
    assert_eq!(w1.status, 200, "{}", w1.text());
    upstream.mode("status=500&delay_ms=3000").await;
    let failing = {
        let addr = gw.addr;
        tokio::spawn(async move { request(addr, "POST", BUY, &[("X-User-Id", "w2")]).await })
    };
    // Sold out once the second winner holds the last unit: the answer offers the line; three
    // buyers join it, in order.
    wait_for_async(
        "the second winner's hold",
        Duration::from_secs(5),
        || async { (gw.activity_view("4001").await["remaining"] == 0).then_some(()) },
    )
    .await;
    let sold_out = buy(&gw, "a", None).await;
    assert_eq!(sold_out.code(), "sold_out", "{}", sold_out.text());
    assert_eq!(
        sold_out.json()["second_chance"]["join"],
        LINE,
        "{}",
        sold_out.text()
    );
    let mut tickets = std::collections::HashMap::new();
    for (place, user) in ["a", "b", "c"].iter().enumerate() {
        let r = line(&gw, "POST", user).await;
        assert_eq!(r.status, 202, "{}", r.text());
        assert_eq!(r.json()["place"], place as u64 + 1, "{}", r.text());
        assert!(r
            .header("set-cookie")
            .unwrap()
            .starts_with("flashgate_ticket=l1."));
        tickets.insert(*user, r.json()["ticket"].as_str().unwrap().to_owned());
    }
    // Every gateway moves the line on each second, and says how long it is.
    wait_for_async("the line's gauge", Duration::from_secs(5), || async {
        let w = gw.metric("flashgate_line_waiting{activity=\"4001\"}").await;
        (w == Some(3.0)).then_some(())
    })
    .await;
    // Outsiders are told sold out from memory while the line is open: no reserve call each.
    let reserves = "flashgate_redis_script_batch_size_count{script=\"reserve\"}";
    let before = gw.metric(reserves).await.unwrap_or(0.0);
    assert!(before >= 2.0, "the winners' reserves are counted: {before}");
    for i in 0..50 {
        assert_eq!(
            buy(&gw, &format!("outsider-{i}"), None).await.code(),
            "sold_out"
        );
    }
    let calls = gw.metric(reserves).await.unwrap_or(0.0) - before;
    assert!(
        calls <= 1.0,
        "{calls} reserve calls for 50 sold-out answers"
    );
    // A script hammers the sale route with fresh buyers from here on.
    let stop = Arc::new(AtomicBool::new(false));
    let won = Arc::new(AtomicU64::new(0));
    let script = {
        let (addr, stop, won) = (gw.addr, stop.clone(), won.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let user = format!("bot-{n}");
                let r = request(addr, "POST", BUY, &[("X-User-Id", user.as_str())]).await;
                if r.status == 200 {
                    won.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        })
    };
    // The backend fails the second winner: its unit comes back, held for the head of the line.
    assert_eq!(failing.await.unwrap().status / 100, 5);
    upstream.mode("status=200&delay_ms=0").await;
    let turn = their_turn(&gw, "a").await;
    assert!(turn["hold_left_ms"].as_u64().unwrap() <= 3000, "{turn}");
    assert_eq!(turn["buy"], BUY, "{turn}");
    assert_eq!(buy(&gw, "b", Some(&tickets["b"])).await.code(), "sold_out");
    let r = buy(&gw, "a", Some(&tickets["a"])).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // An admin release: the next unit is b's.
    let r = gw
        .admin_post(&format!(
            "/v1/activities/4001/reservations/{}/release",
            w1.reservation_id()
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    their_turn(&gw, "b").await;
    assert_eq!(buy(&gw, "c", Some(&tickets["c"])).await.code(), "sold_out");
    assert_eq!(buy(&gw, "b", Some(&tickets["b"])).await.status, 200);
    // A restock: c's turn, but c lets the window pass; it goes to d, who joined after.
    let r = line(&gw, "POST", "d").await;
    assert_eq!(
        (r.status, r.json()["place"].clone()),
        (202, json!(2)),
        "{}",
        r.text()
    );
    let d_ticket = r.json()["ticket"].as_str().unwrap().to_owned();
    let r = gw
        .admin_post_json("/v1/activities/4001/restock", r#"{"add": 1}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    their_turn(&gw, "c").await;
    their_turn(&gw, "d").await;
    assert_eq!(line(&gw, "GET", "c").await.code(), "ticket_expired");
    assert_eq!(buy(&gw, "c", Some(&tickets["c"])).await.code(), "sold_out");
    assert_eq!(buy(&gw, "d", Some(&d_ticket)).await.status, 200);

    stop.store(true, Ordering::Relaxed);
    let tried = script.await.unwrap();
    assert!(tried > 20, "the script tried {tried} times");
    assert_eq!(
        won.load(Ordering::Relaxed),
        0,
        "the script bought a returned unit"
    );
    let orders: Vec<String> = (upstream.requests().await.iter())
        .filter(|r| r["status"] == 200 || r["status"].is_null())
        .filter_map(|r| r["headers"]["x-user-id"].as_str().map(str::to_owned))
        .collect();
    assert!(orders.iter().all(|u| !u.starts_with("bot-")), "{orders:?}");
    let view = gw.activity_view("4001").await;
    assert_eq!(view["second_chance"]["sold"], 3, "{view}");
    assert_eq!(view["second_chance"]["waiting"], 0, "{view}");
    let config = gw.config_path();
    let (code, out, err) = run_cli(&["reconcile", "--config", config.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let args = [
        "report",
        "--config",
        config.to_str().unwrap(),
        "--activity",
        "4001",
        "--json",
    ];
    let (code, out, err) = run_cli(&args, &[]);
    assert_eq!(code, 0, "{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["second_chance"]["sold"], 3, "{story}");
}

/// The second chance in a real headless browser, in English and Chinese, on a desktop and a
/// phone: the sold-out page offers the line, the line's page shows the buyer's place and
/// refreshes itself, and when a unit comes back for them it offers it; the buyer buys it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_in_a_browser_in_both_languages() {
    use crate::browser::{token, IDENTITY_SECRET};
    use crate::drop_pages::{browser_for, FOUR};
    use crate::pages::{press_buy, sign_in};
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sale = TestActivity::explicit("4001", 4, 300).limit(1);
    let mut config = TestConfig::new(&redis, &upstream, vec![sale])
        .jwt_identity(Jwt::session_cookie())
        .set("/activities/0/second_chance", json!({"window_secs": 120}));
    config.per_user = None;
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    let mut winners = Vec::new();
    for i in 0..4 {
        let bearer = format!("Bearer {}", token(&format!("w{i}")));
        let r = request(gw.addr, "POST", BUY, &[("Authorization", bearer.as_str())]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        winners.push(r.reservation_id());
    }
    let read =
        "var p = document.getElementById('place'); var h = document.getElementById('heading'); \
        return {code: document.documentElement.getAttribute('data-flashgate-code'), \
        heading: h ? h.textContent : '', place: p ? p.textContent : null, \
        join: !!document.querySelector('#join-line button'), \
        buy: !!document.querySelector('#buy button'), path: location.pathname, \
        text: document.body ? document.body.innerText : '', \
        overflow: document.documentElement.scrollWidth > window.innerWidth};";
    let origin = format!("http://{}", gw.addr);
    let mut browsers = Vec::new();
    for (i, seat) in FOUR.iter().enumerate() {
        let browser = browser_for(seat).await;
        sign_in(&browser, &origin, &format!("buyer-{i}")).await;
        press_buy(&browser, BUY).await;
        browsers.push(browser);
    }
    for (i, (seat, browser)) in FOUR.iter().zip(&browsers).enumerate() {
        let (sold_out, join) = match seat.lang {
            "en" => ("Sold out", "Join the line"),
            _ => ("已售罄", "加入退回商品候补"),
        };
        let shown = wait_for_async("the sold-out page", Duration::from_secs(15), || async {
            let v = browser.script(read).await;
            (v["code"] == "sold_out" && v["join"] == true).then_some(v)
        })
        .await;
        let text = shown["text"].as_str().unwrap();
        assert!(
            text.contains(sold_out) && text.contains(join),
            "{}: {shown}",
            seat.name()
        );
        assert_eq!(shown["overflow"], false, "{}", seat.name());
        browser
            .screenshot(&format!("line-offered-{}", seat.name()))
            .await;
        browser.click("#join-line button").await;
        let shown = wait_for_async("the line's page", Duration::from_secs(15), || async {
            let v = browser.script(read).await;
            (v["code"] == "queued" && v["path"] == LINE).then_some(v)
        })
        .await;
        assert_eq!(
            shown["place"],
            (i + 1).to_string(),
            "{}: {shown}",
            seat.name()
        );
        assert_eq!(shown["overflow"], false, "{}", seat.name());
        browser
            .screenshot(&format!("line-place-{}", seat.name()))
            .await;
    }
    // Four units come back: each page, refreshing itself, offers one to its buyer, who buys.
    for jti in &winners {
        let path = format!("/v1/activities/4001/reservations/{jti}/release");
        assert_eq!(gw.admin_post(&path).await.status, 200);
    }
    for (seat, browser) in FOUR.iter().zip(&browsers) {
        let heading = match seat.lang {
            "en" => "It is your turn",
            _ => "轮到您了",
        };
        let shown = wait_for_async("the buyer's turn", Duration::from_secs(20), || async {
            let v = browser.script(read).await;
            (v["code"] == "your_turn" && v["buy"] == true).then_some(v)
        })
        .await;
        assert_eq!(shown["heading"], heading, "{}: {shown}", seat.name());
        assert_eq!(shown["overflow"], false, "{}", seat.name());
        browser
            .screenshot(&format!("line-turn-{}", seat.name()))
            .await;
        browser.click("#buy button").await;
    }
    let bought = wait_for_async(
        "four purchases from the line",
        Duration::from_secs(20),
        || async {
            let view = gw.activity_view("4001").await;
            (view["second_chance"]["sold"] == 4).then_some(view)
        },
    )
    .await;
    assert_eq!(bought["second_chance"]["waiting"], 0, "{bought}");
    for browser in &browsers {
        let _ = browser
            .call("DELETE", &format!("/session/{}", browser.session), None)
            .await;
    }
}

/// With a waiting room: a buyer who queued, reached their turn and found the sale sold out
/// joins the line; a returned unit is theirs, bought with the line's ticket (which replaced
/// the queue's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_rooms_buyer_joins_the_line_and_buys_a_return() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sale = TestActivity::explicit("4001", 1, 300)
        .limit(1)
        .queue(Queue::admit(100));
    let mut config = TestConfig::new(&redis, &upstream, vec![sale])
        .set("/activities/0/second_chance", json!({"window_secs": 60}));
    config.per_user = None;
    let gw = GatewayProc::start(config);
    // Through the queue: a ticket, then the purchase at the buyer's turn.
    let through_queue = |user: &'static str| {
        let addr = gw.addr;
        async move {
            let first = request(addr, "POST", BUY, &[("X-User-Id", user)]).await;
            if first.status != 202 {
                return first;
            }
            let ticket = first.json()["ticket"].as_str().unwrap().to_owned();
            wait_for_async("the turn", Duration::from_secs(10), || async {
                let r = request(
                    addr,
                    "POST",
                    BUY,
                    &[("X-User-Id", user), ("X-Flashgate-Ticket", ticket.as_str())],
                )
                .await;
                (r.status != 202).then_some(r)
            })
            .await
        }
    };
    let won = through_queue("x").await;
    assert_eq!(won.status, 200, "{}", won.text());
    let sold_out = through_queue("y").await;
    assert_eq!(sold_out.code(), "sold_out", "{}", sold_out.text());
    assert_eq!(sold_out.json()["second_chance"]["join"], LINE);
    let joined = line(&gw, "POST", "y").await;
    assert_eq!(joined.status, 202, "{}", joined.text());
    let ticket = joined.json()["ticket"].as_str().unwrap().to_owned();
    let path = format!(
        "/v1/activities/4001/reservations/{}/release",
        won.reservation_id()
    );
    assert_eq!(gw.admin_post(&path).await.status, 200);
    their_turn(&gw, "y").await;
    let r = buy(&gw, "y", Some(&ticket)).await;
    assert_eq!(r.status, 200, "{}", r.text());
}
