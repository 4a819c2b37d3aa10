//! A sale in phases, against two real gateways on one redis-server: members (a token claim)
//! and fans (an access list loaded by `flashgate access`) buy before the public start, each
//! with their phase's limit; everyone else is told when their turn opens (403 `not_eligible`)
//! and buys at the public start; one stock and one per-buyer limit across all of it; the JWT
//! names the phase, the admin view counts each one's units, reconcile stays clean.

use crate::browser::IDENTITY_SECRET;
use crate::queue_support::in_secs;
use crate::support::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An identity token for `user` with `extra` claims (a member's `tier`).
pub fn token_with(user: &str, extra: Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("idp1".into());
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let mut claims = json!({ "sub": user, "exp": exp });
    for (k, v) in extra.as_object().unwrap() {
        claims[k] = v.clone();
    }
    jsonwebtoken::encode(
        &header,
        &claims,
        &EncodingKey::from_secret(IDENTITY_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// Activity "3001": `stock` units, 2 a buyer; gold members from a minute ago (1 each), the
/// list `fans` from 30 s ago, everyone at `public`.
pub fn phased(redis: &RedisServer, upstream: &Upstream, stock: u64, public: &str) -> TestConfig {
    let sale = TestActivity::open("3001", stock)
        .limit(2)
        .hours(in_secs(-120), in_secs(3600));
    let mut config = TestConfig::new(redis, upstream, vec![sale])
        .jwt_identity(Jwt::session_cookie())
        .set("/activities/0/starts_at", json!(public))
        .set(
            "/activities/0/phases",
            json!([
                {"id": "members", "starts_at": in_secs(-60),
                 "who": {"claim": "tier", "any_of": ["gold", "silver"]}, "per_user_limit": 1},
                {"id": "fans", "starts_at": in_secs(-30), "who": {"list": "fans"}},
            ]),
        );
    config.per_user = None;
    config
}

pub async fn buy_as(gw: &GatewayProc, token: &str) -> HttpResponse {
    buy_keyed(gw, token, None).await
}

/// A purchase with an `Idempotency-Key`, if given.
async fn buy_keyed(gw: &GatewayProc, token: &str, key: Option<&str>) -> HttpResponse {
    let bearer = format!("Bearer {token}");
    let mut headers = vec![("Authorization", bearer.as_str())];
    headers.extend(key.map(|k| ("Idempotency-Key", k)));
    request(gw.addr, "POST", "/api/seckill/3001/buy", &headers).await
}

/// The `phase` claim of every reservation the backend received for `user`, in order.
async fn phase_of(upstream: &Upstream, user: &str) -> Vec<String> {
    claims_of(upstream, user, "phase").await
}

/// Claim `claim` of every reservation the backend received for `user`, in order.
async fn claims_of(upstream: &Upstream, user: &str, claim: &str) -> Vec<String> {
    upstream
        .requests()
        .await
        .iter()
        .filter_map(|r| r["headers"]["x-flashgate-reservation"].as_str())
        .map(|t| {
            jsonwebtoken::dangerous::insecure_decode::<Value>(t)
                .unwrap()
                .claims
        })
        .filter(|c| c["sub"] == user)
        .map(|c| c[claim].as_str().unwrap_or("(none)").to_owned())
        .collect()
}

fn access(gw: &GatewayProc, args: &[&str]) -> (i32, String, String) {
    let config = gw.config_path();
    let mut all = vec!["access", args[0], "--config", config.to_str().unwrap()];
    all.extend_from_slice(&args[1..]);
    run_cli(&all, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_and_listed_fans_buy_first_then_everyone_within_one_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let public = in_secs(20);
    let config = phased(&redis, &upstream, 10, public);
    let env = [("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)];
    let gw1 = GatewayProc::start_with_env(config.clone(), &env);
    let gw2 = GatewayProc::start_with_env(config.on_new_ports(), &env);
    let gold = token_with("gold-1", json!({"tier": "gold"}));
    let plain = token_with("plain-1", json!({"tier": "bronze"}));

    // A member buys in the members phase, up to that phase's limit (1), on either gateway.
    let won = buy_keyed(&gw1, &gold, Some("g1")).await;
    assert_eq!(won.status, 200, "{}", won.text());
    let again = buy_as(&gw2, &gold).await;
    assert_eq!(again.code(), "limit_exceeded", "{}", again.text());
    // Anyone else is told when their turn opens: the public start.
    let refused = buy_as(&gw2, &plain).await;
    assert_eq!(
        (refused.status, refused.code()),
        (403, "not_eligible".into())
    );
    let opens = refused.json()["opens_at"].as_str().unwrap().to_owned();
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(&opens).unwrap(),
        chrono::DateTime::parse_from_rfc3339(public).unwrap()
    );
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}");

    // A list loaded by the command admits its fans; one dropped admits nobody.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fans.txt");
    std::fs::write(&file, "fan-1\n\n  fan-2 \nfan-1\n").unwrap();
    let (code, out, err) = access(
        &gw1,
        &[
            "load",
            "--activity",
            "3001",
            "--list",
            "fans",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("2 user ids read, 2 new"), "{out}");
    let (code, out, _) = access(&gw1, &["show", "--activity", "3001", "--list", "fans"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("2 user ids") && out.contains("fan-1") && out.contains("fan-2"),
        "{out}"
    );
    let fan = token_with("fan-1", json!({}));
    let r = buy_keyed(&gw2, &fan, Some("f1")).await;
    assert_eq!(r.status, 200, "{}", r.text());

    assert_eq!(
        buy_as(&gw1, &fan).await.status,
        200,
        "a fan's limit is the activity's"
    );
    let (code, _, err) = access(&gw1, &["drop", "--activity", "3001", "--list", "fans"]);
    assert_eq!(code, 0, "{err}");
    let fan2 = token_with("fan-2", json!({}));
    let dropped = buy_as(&gw1, &fan2).await;
    assert_eq!(dropped.code(), "not_eligible", "{}", dropped.text());
    // A purchase already won is still the fan's: their keyed retry gets it back once every
    // gateway sees them on no list (within 2 s), with the phase it was bought in.
    wait_for_async("fan-1 on no list", Duration::from_secs(10), || async {
        (buy_as(&gw2, &fan).await.code() == "not_eligible").then_some(())
    })
    .await;
    let retried = buy_keyed(&gw2, &fan, Some("f1")).await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    let jtis = claims_of(&upstream, "fan-1", "jti").await;
    assert_eq!(jtis.len(), 3);
    assert_eq!(jtis[0], jtis[2], "the same reservation");
    // Bad asks: an unknown list or activity, a bad file (exit 2), nothing loaded.
    let (code, _, err) = access(&gw1, &["show", "--activity", "3001", "--list", "nobody"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no phase with list \"nobody\""), "{err}");
    let (code, _, _) = access(&gw1, &["show", "--activity", "9999", "--list", "fans"]);
    assert_eq!(code, 2);
    std::fs::write(&file, "fan-3\nbad\u{7f}id\n").unwrap();
    let (code, _, err) = access(
        &gw1,
        &[
            "load",
            "--activity",
            "3001",
            "--list",
            "fans",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2"), "{err}");
    let (_, out, _) = access(&gw1, &["show", "--activity", "3001", "--list", "fans"]);
    assert!(out.contains(": 0 user ids"), "{out}");

    // At the public start everyone buys, and the member's limit is the activity's again.
    wait_for_async("the public start", Duration::from_secs(30), || async {
        let r = buy_as(&gw1, &plain).await;
        (r.status == 200).then_some(())
    })
    .await;
    assert_eq!(buy_as(&gw2, &gold).await.status, 200);
    let third = buy_as(&gw1, &gold).await;
    assert_eq!(third.code(), "limit_exceeded", "one limit across phases");
    // A replay after the public start names the phase the purchase was made in.
    assert_eq!(buy_keyed(&gw2, &gold, Some("g1")).await.status, 200);

    assert_eq!(
        phase_of(&upstream, "gold-1").await,
        ["members", "public", "members"]
    );
    assert_eq!(phase_of(&upstream, "fan-1").await, ["fans", "fans", "fans"]);
    assert_eq!(phase_of(&upstream, "plain-1").await, ["public"]);
    let view = gw1.activity_view("3001").await;
    let sold: Vec<(String, u64)> = view["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["sold"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sold,
        [("members".to_owned(), 1), ("fans".to_owned(), 2)],
        "{view}"
    );
    assert_eq!(view["public"]["sold"], 2, "{view}");
    assert!(view["phases"][0]["starts_at"].as_str().is_some());
    // Each gateway counts the units it reserved, by phase; together, the sale's.
    for (phase, units) in [("members", 1.0), ("fans", 2.0), ("public", 2.0)] {
        let series = format!("flashgate_phase_units_total{{activity=\"3001\",phase=\"{phase}\"}}");
        let one = gw1.metric(&series).await.unwrap_or(-1.0);
        let two = gw2.metric(&series).await.unwrap_or(-1.0);
        assert_eq!(one + two, units, "{series}");
    }
    let (code, out, err) = run_cli(
        &["reconcile", "--config", gw1.config_path().to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    // The report tells the same, as JSON and as text.
    let config = gw1.config_path();
    let args = [
        "report",
        "--config",
        config.to_str().unwrap(),
        "--activity",
        "3001",
    ];
    let (code, out, err) = run_cli(&[&args[..], &["--json"]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    let phases: Vec<(&str, u64)> = (story["phases"].as_array().unwrap().iter())
        .map(|p| (p["id"].as_str().unwrap(), p["sold"].as_u64().unwrap()))
        .collect();
    assert_eq!(phases, [("members", 1), ("fans", 2)], "{story}");
    assert_eq!(story["public"]["sold"], 2, "{story}");
    let (_, text, _) = run_cli(&args, &[]);
    assert!(text.contains("phase members"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_phase_counts_only_from_the_trusted_auth_layer_and_is_stripped() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sale = TestActivity::open("3002", 5)
        .limit(1)
        .hours(in_secs(-120), in_secs(3600))
        .starts_at(in_secs(600));
    let config = |trusted: &[&'static str]| {
        TestConfig::new(&redis, &upstream, vec![sale.clone()])
            .jwt_identity(Jwt::session_cookie())
            .trusted_proxies(trusted)
            .set(
                "/activities/0/phases",
                json!([{"id": "vip", "starts_at": in_secs(-60),
                        "who": {"header": "X-Member-Tier", "any_of": ["vip"]}}]),
            )
    };
    let env = [("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)];
    let untrusting = GatewayProc::start_with_env(config(&["10.0.0.0/8"]), &env);
    let trusting = GatewayProc::start_with_env(config(&["127.0.0.1/32"]).on_new_ports(), &env);
    let bearer = format!("Bearer {}", token_with("u1", json!({})));
    let ask = |gw: &GatewayProc| {
        let addr = gw.addr;
        let bearer = bearer.clone();
        async move {
            request(
                addr,
                "POST",
                "/api/seckill/3002/buy",
                &[("Authorization", bearer.as_str()), ("X-Member-Tier", "vip")],
            )
            .await
        }
    };
    // From a peer that is not a trusted proxy the header claims nothing, and no backend request
    // carries it.
    let r = ask(&untrusting).await;
    assert_eq!(r.code(), "not_eligible", "{}", r.text());
    let r = request(
        untrusting.addr,
        "GET",
        "/other",
        &[("X-Member-Tier", "vip")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        (upstream.requests().await.iter()).all(|r| r["headers"].get("x-member-tier").is_none()),
        "the header reached the backend from an untrusted peer"
    );
    // From the auth layer it admits.
    let r = ask(&trusting).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(phase_of(&upstream, "u1").await, ["vip"]);
}

/// Not yet eligible, in a real headless browser in English and Chinese, on a desktop and a
/// phone: the page says it is not the buyer's turn yet, when it opens (their local time) with a
/// countdown, and buys by itself at the public start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_not_yet_eligible_page_says_when_in_both_languages_and_buys_then() {
    use crate::drop_pages::{browser_for, FOUR};
    use crate::pages::{press_buy, sign_in};
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Far enough ahead that four browsers load the page before it on a loaded machine.
    let public = in_secs(50);
    let config = phased(&redis, &upstream, 10, public);
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    let read = "return [document.documentElement.getAttribute('data-flashgate-code'), \
                document.querySelector('h1') ? document.querySelector('h1').textContent : null, \
                document.getElementById('opens-at') ? document.getElementById('opens-at').textContent : null, \
                document.getElementById('countdown') ? document.getElementById('countdown').textContent : null, \
                document.documentElement.scrollWidth > window.innerWidth];";
    let origin = format!("http://{}", gw.addr);
    let mut browsers = Vec::new();
    for (i, seat) in FOUR.iter().enumerate() {
        let browser = browser_for(seat).await;
        sign_in(&browser, &origin, &format!("buyer-{i}")).await;
        press_buy(&browser, "/api/seckill/3001/buy").await;
        browsers.push(browser);
    }
    for (seat, browser) in FOUR.iter().zip(&browsers) {
        let (heading, opens_in) = match seat.lang {
            "en" => ("Not your turn yet", "Opens in"),
            _ => ("尚未轮到您", "距开放还有"),
        };
        let shown = wait_for_async("the not-eligible page", Duration::from_secs(15), || async {
            let v = browser.script(read).await;
            (v[0] == "not_eligible" && v[3].as_str().is_some_and(|c| c.contains(opens_in)))
                .then_some(v)
        })
        .await;
        assert!(
            shown[1].as_str().unwrap().contains(heading),
            "{}: {shown}",
            seat.name()
        );
        let when = shown[2].as_str().unwrap();
        assert!(
            !when.contains('T') && !when.is_empty(),
            "{}: {shown}",
            seat.name()
        );
        assert_eq!(shown[4], false, "{}: overflow", seat.name());
        browser
            .screenshot(&format!("not-eligible-{}", seat.name()))
            .await;
    }
    // At the public start every page sends the purchase again by itself.
    let landed = wait_for_async("four purchases", Duration::from_secs(90), || async {
        let sold = (0..4).map(|i| format!("buyer-{i}"));
        let mut phases = Vec::new();
        for user in sold {
            phases.extend(phase_of(&upstream, &user).await);
        }
        (phases.len() == 4).then_some(phases)
    })
    .await;
    assert!(landed.iter().all(|p| p == "public"), "{landed:?}");
    for browser in &browsers {
        let _ = browser
            .call("DELETE", &format!("/session/{}", browser.session), None)
            .await;
    }
}

/// With a waiting room: a member queues in their phase (a ticket, then their turn), a buyer in
/// no phase is told when theirs opens and gets no ticket; the pre-queue before the first phase
/// is the first phase's buyers' only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phases_buyers_queue_and_the_others_wait_for_their_opening() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let public = in_secs(600);
    let mut config = phased(&redis, &upstream, 10, public);
    config.activities[0] = config.activities[0].clone().queue(Queue::admit(50));
    let gw = GatewayProc::start_with_env(config, &[("FLASHGATE_IDENTITY_SECRET", IDENTITY_SECRET)]);
    let gold = token_with("gold-1", json!({"tier": "gold"}));
    let plain = token_with("plain-1", json!({}));
    let first = buy_as(&gw, &gold).await;
    assert!(
        first.status == 202 || first.status == 200,
        "{}",
        first.text()
    );
    if first.status == 202 {
        let ticket = first.json()["ticket"].as_str().unwrap().to_owned();
        let bearer = format!("Bearer {gold}");
        wait_for_async("the member's turn", Duration::from_secs(20), || async {
            let r = request(
                gw.addr,
                "POST",
                "/api/seckill/3001/buy",
                &[
                    ("Authorization", bearer.as_str()),
                    ("X-Flashgate-Ticket", ticket.as_str()),
                ],
            )
            .await;
            (r.status == 200).then_some(())
        })
        .await;
    }
    let refused = buy_as(&gw, &plain).await;
    assert_eq!(refused.code(), "not_eligible", "{}", refused.text());
    assert!(refused.json().get("ticket").is_none());
    assert_eq!(phase_of(&upstream, "gold-1").await, ["members"]);
}
