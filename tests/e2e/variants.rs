//! Drops with variants (issue 34), against the real gateway and redis-server: one activity, a
//! stock per variant, one per-buyer limit across them all (checked in the same script as the
//! variant's stock), the variant named once by the route, per-variant sold out, restock,
//! reconcile and gauges, and the JWT's `var`.

use crate::support::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

const VARIANTS: [(&str, u64); 3] = [("42", 100), ("43", 120), ("44", 80)];

/// A drop "2001" with three variants (`?variant=`), `limit` units per buyer across them.
fn drop_config(redis: &RedisServer, upstream: &Upstream, limit: u32) -> TestConfig {
    let mut config = TestConfig::new(
        redis,
        upstream,
        vec![TestActivity::open("2001", 0).limit(limit)],
    );
    config.per_user = None;
    let variants: Vec<Value> = VARIANTS
        .iter()
        .map(|(id, stock)| json!({"id": id, "stock": stock, "title": format!("EU {id}")}))
        .collect();
    config
        .set("/activities/0/stock", Value::Null)
        .set("/activities/0/variants", json!(variants))
        .set("/sale_routes/0/variant_query", json!("variant"))
}

fn buy_path(variant: &str) -> String {
    format!("/api/seckill/2001/buy?variant={variant}")
}

async fn buy(gw: &GatewayProc, user: &str, variant: &str) -> HttpResponse {
    request(gw.addr, "POST", &buy_path(variant), &[("X-User-Id", user)]).await
}

/// The activity's view once nothing of it is pending (every winner confirmed).
async fn settled(gw: &GatewayProc) -> Value {
    wait_for_async(
        "every winner confirmed",
        Duration::from_secs(10),
        || async {
            let view = gw.activity_view("2001").await;
            (view["pending"] == 0).then_some(view)
        },
    )
    .await
}

/// The claims of every reservation the backend received.
async fn sold(upstream: &Upstream) -> Vec<Value> {
    upstream
        .requests()
        .await
        .iter()
        .filter_map(|r| r["headers"]["x-flashgate-reservation"].as_str())
        .map(|token| {
            jsonwebtoken::dangerous::insecure_decode::<Value>(token)
                .unwrap()
                .claims
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_buyers_at_every_variant_at_once_hold_one_unit_each() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gw = GatewayProc::start(drop_config(&redis, &upstream, 1));
    // Every buyer fires a purchase for each of the three variants at once.
    let requests: Vec<String> = (0..300)
        .flat_map(|u| {
            VARIANTS.iter().map(move |(v, _)| {
                raw_request(
                    "POST",
                    &buy_path(v),
                    &[("X-User-Id", &format!("buyer-{u}"))],
                )
            })
        })
        .collect();
    let answers = burst(gw.addr, requests).await;
    let won = answers.iter().filter(|r| r.status == 200).count();
    for r in &answers {
        assert!(
            matches!(
                (r.status, r.code().as_str()),
                (200, _) | (409, "limit_exceeded") | (410, "sold_out") | (503, "unavailable")
            ),
            "{} {}",
            r.status,
            r.text()
        );
    }
    let claims = sold(&upstream).await;
    assert_eq!(claims.len(), won, "every winner reached the backend once");
    let mut per_buyer: HashMap<String, u64> = HashMap::new();
    let mut per_variant: HashMap<String, u64> = HashMap::new();
    for c in &claims {
        assert_eq!(c["act"], "2001", "{c}");
        *per_buyer
            .entry(c["sub"].as_str().unwrap().to_owned())
            .or_default() += c["qty"].as_u64().unwrap();
        *per_variant
            .entry(c["var"].as_str().unwrap().to_owned())
            .or_default() += c["qty"].as_u64().unwrap();
    }
    assert!(
        per_buyer.values().all(|&n| n <= 1),
        "a buyer over the limit across variants: {per_buyer:?}"
    );
    for (v, stock) in VARIANTS {
        assert!(
            per_variant.get(v).copied().unwrap_or(0) <= stock,
            "{per_variant:?}"
        );
    }
    // Every variant's identity exact, in the view and in reconcile (a line per variant).
    let view = settled(&gw).await;
    for (v, stock) in VARIANTS {
        let row = view["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == v)
            .unwrap_or_else(|| panic!("variant {v} in {view}"));
        let sold = per_variant.get(v).copied().unwrap_or(0) as i64;
        assert_eq!(row["stock"], stock, "{row}");
        assert_eq!(
            row["remaining"].as_i64().unwrap() + row["confirmed"].as_i64().unwrap(),
            stock as i64,
            "{row}"
        );
        assert_eq!(row["confirmed"].as_i64().unwrap(), sold, "{row}");
    }
    let table = gw.reconcile_clean();
    for (v, _) in VARIANTS {
        assert!(table.contains(&format!("variant={v}")), "{table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_variant_is_named_once_and_must_be_sold() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = drop_config(&redis, &upstream, 2);
    config.activities.push(TestActivity::open("1001", 10));
    let gw = GatewayProc::start(config);
    let user = [("X-User-Id", "alice")];
    for (path, status, code) in [
        ("/api/seckill/2001/buy", 400, "bad_request"),
        (
            "/api/seckill/2001/buy?variant=42&variant=43",
            400,
            "bad_request",
        ),
        (
            "/api/seckill/2001/buy?variant=42&Variant=43",
            400,
            "bad_request",
        ),
        ("/api/seckill/2001/buy?variant=4%32", 400, "bad_request"),
        ("/api/seckill/2001/buy?variant=99", 404, "unknown_variant"),
        ("/api/seckill/1001/buy?variant=42", 400, "bad_request"),
    ] {
        let r = request(gw.addr, "POST", path, &user).await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (status, code),
            "{path}: {}",
            r.text()
        );
    }
    assert!(
        upstream.requests().await.is_empty(),
        "nothing refused reached the backend"
    );
    // Plain activities sell as before; a variant purchase names the variant in its answer.
    assert_eq!(gw.buy("1001", "alice", None).await.status, 200);
    assert_eq!(buy(&gw, "alice", "43").await.status, 200);
    // A keyed retry is the same purchase: the same reservation; naming another variant is not.
    let keyed = |v: &'static str| async move {
        request(
            gw.addr,
            "POST",
            &buy_path(v),
            &[("X-User-Id", "bob"), ("Idempotency-Key", "k-1")],
        )
        .await
    };
    let first = keyed("42").await;
    assert_eq!(first.status, 200, "{}", first.text());
    let again = keyed("42").await;
    assert_eq!(again.status, 200, "{}", again.text());
    let other = keyed("44").await;
    assert_eq!(
        (other.status, other.code().as_str()),
        (400, "bad_request"),
        "{}",
        other.text()
    );
    let claims = sold(&upstream).await;
    let bobs: Vec<&Value> = claims.iter().filter(|c| c["sub"] == "bob").collect();
    assert_eq!(bobs.len(), 2, "{claims:?}");
    assert_eq!(
        bobs[0]["jti"], bobs[1]["jti"],
        "a replay returns the same jti"
    );
    assert_eq!(bobs[0]["var"], "42");
    let plain: Vec<&Value> = claims.iter().filter(|c| c["act"] == "1001").collect();
    assert!(plain[0].get("var").is_none(), "{:?}", plain[0]);
    gw.reconcile_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variant_sold_out_leaves_the_others_on_sale_and_a_restock_sells_it_again() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = drop_config(&redis, &upstream, 1);
    config = config.set(
        "/activities/0/variants",
        json!([{"id": "42", "stock": 2}, {"id": "43", "stock": 5}]),
    );
    let gw = GatewayProc::start(config.clone());
    // A second gateway of the fleet: news and the restock reach it.
    let other = GatewayProc::start(config.on_new_ports());
    for u in 0..2 {
        assert_eq!(buy(&gw, &format!("a{u}"), "42").await.status, 200);
    }
    for g in [&gw, &other] {
        let r = buy(g, "late", "42").await;
        assert_eq!(
            (r.status, r.code().as_str()),
            (410, "sold_out"),
            "{}",
            r.text()
        );
        assert!(
            r.text().contains("42"),
            "the message names the variant: {}",
            r.text()
        );
        assert_eq!(r.json()["variant"], "42");
    }
    assert_eq!(
        buy(&other, "b0", "43").await.status,
        200,
        "another variant still sells"
    );
    let view = gw.activity_view("2001").await;
    assert_eq!(view["sold_out"], false, "{view}");
    let v42 = &view["variants"][0];
    assert_eq!(
        (v42["id"].clone(), v42["sold_out"].clone()),
        (json!("42"), json!(true))
    );
    gw.wait_metric(
        r#"flashgate_stock_remaining{activity="2001",variant="42"}"#,
        0.0,
    )
    .await;

    // A restock names its variant on an activity with variants.
    let r = gw
        .admin_post_json("/v1/activities/2001/restock", r#"{"add": 3}"#)
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = gw
        .admin_post_json(
            "/v1/activities/2001/restock",
            r#"{"add": 3, "variant": "99"}"#,
        )
        .await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "unknown_variant"),
        "{}",
        r.text()
    );
    let r = gw
        .admin_post_json(
            "/v1/activities/2001/restock",
            r#"{"add": 3, "variant": "42"}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["variants"][0]["remaining"], 3, "{}", r.text());
    // It sells on every gateway of the fleet (news lifts the other's sold-out mark).
    let bought = wait_for_async(
        "the restock sells on the other gateway",
        Duration::from_secs(10),
        || async {
            let r = buy(&other, "c0", "42").await;
            (r.status == 200).then_some(r)
        },
    )
    .await;
    assert_eq!(bought.status, 200);
    assert_eq!(buy(&gw, "c1", "42").await.status, 200);
    let view = settled(&gw).await;
    assert_eq!(view["variants"][0]["remaining"], 1, "{view}");
    assert_eq!(view["variants"][1]["remaining"], 4, "{view}");
    assert_eq!(view["remaining"], 5, "the activity's: the sum, {view}");
    gw.wait_metric(
        r#"flashgate_stock_remaining{activity="2001",variant="43"}"#,
        4.0,
    )
    .await;
    // One restock key restocks one variant once: the same key naming another is refused.
    let keyed = |variant: &str| format!(r#"{{"add": 2, "variant": "{variant}"}}"#);
    let r = gw.restock("2001", &keyed("43"), Some("r-1")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = other.restock("2001", &keyed("42"), Some("r-1")).await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "key_used"),
        "{}",
        r.text()
    );
    let r = other.restock("2001", &keyed("43"), Some("r-1")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let view = gw.activity_view("2001").await;
    assert_eq!(view["variants"][0]["remaining"], 1, "{view}");
    assert_eq!(view["variants"][1]["remaining"], 6, "added once: {view}");
    let table = gw.reconcile_clean();
    assert!(
        table.contains("variant=42") && table.contains("variant=43"),
        "{table}"
    );
}

/// A drop "2001" with `variants` (id, stock), `activity`'s settings otherwise.
fn drop_with(
    redis: &RedisServer,
    upstream: &Upstream,
    activity: TestActivity,
    variants: &[(&str, u64)],
) -> TestConfig {
    let mut config = TestConfig::new(redis, upstream, vec![activity]);
    config.per_user = None;
    let variants: Vec<Value> = variants
        .iter()
        .map(|(id, stock)| json!({"id": id, "stock": stock}))
        .collect();
    config
        .set("/activities/0/stock", Value::Null)
        .set("/activities/0/variants", json!(variants))
        .set("/sale_routes/0/variant_query", json!("variant"))
}

/// Asserts that `variant` stays refused (503) for `secs` of prewarm ticks, asked every 100 ms.
async fn stays_refused(gw: &GatewayProc, user: &str, variant: &str, secs: u64) {
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        let r = buy(gw, user, variant).await;
        assert_eq!(r.status, 503, "{variant}: {}", r.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Review of issue 34: the buyers' units hash is the activity's, shared by its variants' lanes;
/// a variant's prewarm made it again (empty) once it was lost, and the limit across variants
/// started over. Lost, it stops every variant for good (as on an activity without variants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_buyers_units_hash_stops_every_variant() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).limit(1);
    let config = drop_with(&redis, &upstream, activity, &[("42", 5), ("43", 5)]);
    let gw = GatewayProc::start(config.prewarm_interval_ms(200));
    assert_eq!(buy(&gw, "alice", "42").await.status, 200);
    assert_eq!(buy(&gw, "alice", "43").await.code(), "limit_exceeded");
    redis.del(&["fg:{2001}:users"]);
    // Well past several prewarm ticks (200 ms): still refused, both variants.
    for v in ["43", "42"] {
        stays_refused(&gw, "alice", v, 1).await;
    }
    let (code, table) = gw.reconcile();
    assert_eq!(code, 1, "{table}");
}

/// Review of issue 34: a lost idempotency hash let one key reserve twice. Lost, it refuses
/// every purchase of the activity (a key's purchase cannot be told from a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_idempotency_hash_never_sells_a_key_twice() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).limit(2);
    let config = drop_with(&redis, &upstream, activity, &[("42", 5), ("43", 5)]);
    let gw = GatewayProc::start(config.prewarm_interval_ms(200));
    let keyed = || {
        request(
            gw.addr,
            "POST",
            "/api/seckill/2001/buy?variant=42",
            &[("X-User-Id", "bob"), ("Idempotency-Key", "k-1")],
        )
    };
    assert_eq!(keyed().await.status, 200);
    redis.del(&["fg:{2001}:idem"]);
    let until = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < until {
        let r = keyed().await;
        assert_eq!(r.status, 503, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let jtis: std::collections::HashSet<String> = sold(&upstream)
        .await
        .iter()
        .map(|c| c["jti"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(jtis.len(), 1, "one key, one reservation: {jtis:?}");
}

/// Review of issue 34: a variant removed under a new version kept its pending holds forever
/// (the sweep reached configured lanes only), holding its buyers' units across variants. Every
/// lane Redis registered is swept; the admin API and reconcile still reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_variants_hold_still_ends_and_frees_its_buyer() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::explicit("2001", 0, 2).limit(1);
    let config = drop_with(&redis, &upstream, activity, &[("42", 5), ("44", 5)]);
    let mut gw = GatewayProc::start(config.clone());
    assert_eq!(buy(&gw, "alice", "44").await.status, 200);
    let jti = sold(&upstream).await[0]["jti"].as_str().unwrap().to_owned();
    let mut next = config.clone();
    next.activities[0].version = 2;
    gw.rewrite_config(next.set("/activities/0/variants", json!([{"id": "42", "stock": 5}])));
    let reload = gw.admin_post("/v1/config/reload").await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    // Due at the later of its hold and its forward's longest trip.
    let path = format!("/v1/activities/2001/reservations/{jti}");
    wait_for_async(
        "the removed variant's hold ends",
        Duration::from_secs(30),
        || async {
            let view = gw.admin_get(&path).await;
            (view.json()["state"] == "released").then_some(())
        },
    )
    .await;
    assert_eq!(
        buy(&gw, "alice", "42").await.status,
        200,
        "her unit came back"
    );
    let table = gw.reconcile_clean();
    assert!(table.contains("variant=44"), "{table}");
}

/// Review of issue 34: a restart whose YAML adds a variant under the version already on sale
/// put its stock on sale; Redis records the variants a version went on sale with (claim.lua),
/// so the added one is refused whatever the YAML, and the others sell on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variant_added_under_a_version_on_sale_is_refused() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).limit(1);
    let config = drop_with(&redis, &upstream, activity, &[("42", 5), ("43", 5)]);
    let mut gw = GatewayProc::start(config.clone());
    assert_eq!(buy(&gw, "a", "42").await.status, 200);
    gw.kill();
    let added = config.on_new_ports().set(
        "/activities/0/variants",
        json!([{"id": "42", "stock": 5}, {"id": "43", "stock": 5}, {"id": "44", "stock": 3}]),
    );
    let gw = GatewayProc::start(added);
    let refused = wait_for_async("variant 44 refused", Duration::from_secs(10), || async {
        let view = gw.activity_view("2001").await;
        view["variants"][2]["refused"].as_str().map(str::to_owned)
    })
    .await;
    assert!(refused.contains("variant 44"), "{refused}");
    let r = buy(&gw, "c", "44").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (503, "unavailable"),
        "{}",
        r.text()
    );
    assert_eq!(buy(&gw, "b", "43").await.status, 200, "the others sell on");
    assert!(sold(&upstream).await.iter().all(|c| c["var"] != "44"));
}

/// One waiting room for the drop: a ticket holder waits while any variant is left (the poll
/// lists each and whether it is available), buys the variant they choose at their turn, and a
/// waiting ticket reads `sold_out` only once every variant is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drops_waiting_room_waits_while_any_variant_is_left() {
    use crate::queue_support::{poll, TICKET};
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).queue(Queue::admit(1).window_secs(60));
    let config = drop_with(&redis, &upstream, activity, &[("42", 0), ("43", 1)]);
    let gw = GatewayProc::start(config);
    assert_eq!(
        gw.admin_post("/v1/activities/2001/queue/pause")
            .await
            .status,
        200
    );
    // Arrivals need not name a variant: a place first.
    let mut tickets = Vec::new();
    for user in ["alice", "carol"] {
        let r = request(
            gw.addr,
            "POST",
            "/api/seckill/2001/buy",
            &[("X-User-Id", user)],
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.text());
        tickets.push(r.json()["ticket"].as_str().unwrap().to_owned());
    }
    let listed = wait_for_async("the variants listed", Duration::from_secs(10), || async {
        let p = poll(&gw, "2001", "carol", &tickets[1]).await;
        (p["variants"][0]["available"] == false).then_some(p)
    })
    .await;
    assert_eq!(
        listed["state"], "waiting",
        "one variant is gone, another is left: {listed}"
    );
    assert_eq!(
        listed["variants"],
        json!([
            {"id": "42", "title": "42", "available": false},
            {"id": "43", "title": "43", "available": true}
        ])
    );
    assert_eq!(
        gw.admin_post("/v1/activities/2001/queue/resume")
            .await
            .status,
        200
    );
    // Alice's turn: a purchase naming no variant cannot take stock; naming 43, it does.
    let bought = wait_for_async("alice's turn", Duration::from_secs(20), || async {
        let r = request(
            gw.addr,
            "POST",
            "/api/seckill/2001/buy?variant=43",
            &[("X-User-Id", "alice"), (TICKET, &tickets[0])],
        )
        .await;
        (r.status == 200).then_some(r)
    })
    .await;
    assert_eq!(bought.status, 200);
    // Every variant gone: carol's ticket reads sold_out.
    let last = wait_for_async("carol told sold out", Duration::from_secs(20), || async {
        let p = poll(&gw, "2001", "carol", &tickets[1]).await;
        (p["state"] == "sold_out").then_some(p)
    })
    .await;
    assert_eq!(last["code"], "sold_out", "{last}");
    gw.reconcile_clean();
}

/// The size whose last unit a buyer just bought is offered to nobody else: the next poll on
/// the gateway that sold it lists it unavailable at once (not at the next queue read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_sold_here_is_unavailable_in_the_very_next_poll() {
    use crate::queue_support::{poll, TICKET};
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).queue(Queue::admit(1000).window_secs(60));
    let config = drop_with(&redis, &upstream, activity, &[("42", 1), ("43", 1)]);
    let gw = GatewayProc::start(config);
    let mut tickets = Vec::new();
    for user in ["alice", "carol"] {
        let r = request(
            gw.addr,
            "POST",
            "/api/seckill/2001/buy",
            &[("X-User-Id", user)],
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.text());
        tickets.push(r.json()["ticket"].as_str().unwrap().to_owned());
    }
    wait_for_async(
        "carol's turn, both sizes listed",
        Duration::from_secs(10),
        || async {
            let p = poll(&gw, "2001", "carol", &tickets[1]).await;
            (p["state"] == "your_turn" && p["variants"][0]["available"] == true).then_some(p)
        },
    )
    .await;
    let bought = request(
        gw.addr,
        "POST",
        "/api/seckill/2001/buy?variant=42",
        &[("X-User-Id", "alice"), (TICKET, &tickets[0])],
    )
    .await;
    assert_eq!(bought.status, 200, "{}", bought.text());
    let p = poll(&gw, "2001", "carol", &tickets[1]).await;
    assert_eq!(
        p["variants"],
        json!([
            {"id": "42", "title": "42", "available": false},
            {"id": "43", "title": "43", "available": true}
        ]),
        "{p}"
    );
}

/// A drop whose store was flushed: nothing sells twice (every variant fenced), reconcile
/// names the variants, a plain resume is refused, and a variant's recount says why it cannot
/// be (the buyers' units across variants are gone with the flush): 409, never 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_drop_sells_nothing_twice_and_says_why() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).limit(1);
    let config = drop_with(&redis, &upstream, activity, &[("42", 3), ("43", 3)]);
    let gw = GatewayProc::start(config);
    assert_eq!(buy(&gw, "a", "42").await.status, 200);
    assert_eq!(buy(&gw, "b", "43").await.status, 200);
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    wait_for_async("the loss found", Duration::from_secs(10), || async {
        let view = gw.activity_view("2001").await;
        view["fenced"]["lost"].as_str().map(str::to_owned)
    })
    .await;
    for (user, v) in [("c", "42"), ("d", "43"), ("a", "43")] {
        let r = buy(&gw, user, v).await;
        assert_eq!(r.status, 503, "{v}: {}", r.text());
    }
    let (code, table) = gw.reconcile();
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("variant=42"), "{table}");
    let r = gw.admin_post("/v1/activities/2001/resume").await;
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "store_lost_sales"),
        "{}",
        r.text()
    );
    let r = gw
        .admin_post_json(
            "/v1/activities/2001/resume",
            r#"{"remaining": 2, "variant": "42"}"#,
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("new activity id"), "{}", r.text());
    assert_eq!(
        sold(&upstream).await.len(),
        2,
        "nothing sold after the flush"
    );
}

/// Found by review: a gateway that never saw the sale, started on the emptied store while the
/// one that did was away, made the drop's keys again, the shared buyers' units hash with them
/// (empty); back, the first gateway fenced the loss, and a count of one size then passed the
/// units check and let every buyer buy again. A lane whose keys were gone refuses the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_after_another_gateway_remade_the_keys_is_refused() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).limit(1);
    let config = drop_with(&redis, &upstream, activity, &[("42", 3), ("43", 3)]);
    let a = GatewayProc::start(config.clone());
    assert_eq!(buy(&a, "u1", "42").await.status, 200);
    assert_eq!(buy(&a, "u4", "43").await.status, 200);
    a.signal("STOP");
    redis.kill();
    redis.restart();
    let b = GatewayProc::start(config.on_new_ports());
    a.signal("CONT");
    for gw in [&a, &b] {
        wait_for_async("the loss fenced", Duration::from_secs(20), || async {
            let view = gw.activity_view("2001").await;
            view["variants"][0]["fenced"]["lost"]
                .as_str()
                .map(str::to_owned)
        })
        .await;
    }
    for gw in [&a, &b] {
        for size in ["42", "43"] {
            let r = gw
                .admin_post_json(
                    "/v1/activities/2001/resume",
                    &format!(r#"{{"remaining": 2, "variant": "{size}"}}"#),
                )
                .await;
            assert_eq!(r.status, 409, "{size}: {}", r.text());
            assert!(r.text().contains("new activity id"), "{}", r.text());
        }
    }
    for gw in [&a, &b] {
        assert_eq!(buy(gw, "u1", "42").await.status, 503, "nobody buys again");
    }
    assert_eq!(sold(&upstream).await.len(), 2);
}

/// Review of the change: readiness looked at activities, refusals at variants' lanes, so a drop
/// refused on a Redis that may evict keys read ready. Not ready, naming the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_on_a_redis_that_may_evict_is_not_ready() {
    let redis = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut redis.conn())
        .unwrap();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).limit(1);
    let gw = GatewayProc::start(drop_with(&redis, &upstream, activity, &[("42", 3)]));
    // Not ready once the first prewarm read the policy (a moment after start).
    let r = wait_for_async("not ready", Duration::from_secs(10), || async {
        let r = get(gw.admin, "/readyz", &[]).await;
        (r.status == 503).then_some(r)
    })
    .await;
    assert!(r.text().contains("allkeys-lru"), "{}", r.text());
    let b = buy(&gw, "a", "42").await;
    assert_eq!(b.status, 503, "{}", b.text());
}

/// Half sizes are variant ids as catalogues write them: `40.5` is bought as itself (its own
/// stock, its own units in the ledger), `40` beside it is another size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_size_is_a_variant_of_its_own() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let activity = TestActivity::open("2001", 0).limit(2);
    let gw = GatewayProc::start(drop_with(
        &redis,
        &upstream,
        activity,
        &[("40", 1), ("40.5", 1)],
    ));
    let keyed = |variant: &str| {
        let path = buy_path(variant);
        async move {
            request(
                gw.addr,
                "POST",
                &path,
                &[("X-User-Id", "alice"), ("Idempotency-Key", "k-half")],
            )
            .await
        }
    };
    let half = keyed("40.5").await;
    assert_eq!(half.status, 200, "{}", half.text());
    // Her key's retry naming size 40 is not a retry of her 40.5 (once read as one: the id's
    // "~40.5" was taken for size 40 in segment 5).
    let other = keyed("40").await;
    assert_eq!(other.status, 400, "{}", other.text());
    assert!(other.text().contains("another variant"), "{}", other.text());
    assert_eq!(buy(&gw, "bob", "40.5").await.code(), "sold_out");
    assert_eq!(buy(&gw, "bob", "40").await.status, 200);
    let claims = sold(&upstream).await;
    let variants: Vec<&str> = claims.iter().filter_map(|c| c["var"].as_str()).collect();
    assert_eq!(variants, ["40.5", "40"], "{claims:?}");
    let view = settled(&gw).await;
    assert_eq!(view["confirmed"], 2, "{view}");
    // The half size's reservation is found by its id (the admin API, reconcile --orders).
    let jtis: Vec<String> = claims
        .iter()
        .map(|c| c["jti"].as_str().unwrap().to_owned())
        .collect();
    let found = gw
        .admin_get(&format!("/v1/activities/2001/reservations/{}", jtis[0]))
        .await;
    assert_eq!(found.status, 200, "{}: {}", jtis[0], found.text());
    assert_eq!(found.json()["state"], "confirmed", "{}", found.text());
    let (code, report) = gw.reconcile_orders("2001", &jtis, false);
    assert_eq!(code, 0, "{report}");
    // The decision lines and the prewarm's name the size.
    let logs = gw.logs();
    assert!(logs.contains(r#"variant="40.5""#), "{logs}");
    assert!(
        logs.lines()
            .any(|l| l.contains("stock prewarmed") && l.contains(r#"variant="40.5""#)),
        "{logs}"
    );
}
