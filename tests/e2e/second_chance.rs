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
