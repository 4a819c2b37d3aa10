//! The model test's generator driving the real binaries: two flashgate processes on one
//! redis-server in front of the demo backend, over HTTP and the admin API. Three activities:
//! a plain one, a segmented one, and a drop of two variants over two segments (one limit per
//! buyer across its variants; a keyed retry naming another variant is refused). Fewer, longer
//! sequences than `tests/model.rs` (each starts real processes), and since time runs for real
//! here (holds of two seconds run out, sweeps and order lookups run in the background), the
//! checks are the invariants rather than exact answers:
//!
//! - after every step: `reconcile` clean (every ledger balanced and agreeing with the records);
//!   no version sold past its stock; no user over the highest limit ever configured; of two
//!   reservations one idempotency key got, the older was released before the newer was made;
//! - at the end, once every hold has settled: every order the backend took is confirmed in
//!   Redis (none released, so none sold twice), and nothing is left pending.
//!
//! `PROPTEST_CASES` sets the number of sequences (`scripts/reliability integrity` runs more).

#[path = "support/mod.rs"]
mod support;

use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;

const USERS: usize = 4;
const LIMIT: u32 = 2;

#[derive(Clone, Debug)]
enum Op {
    Buy {
        gw: usize,
        act: usize,
        user: usize,
        qty: u32,
        key: Option<u8>,
        /// The variant bought, on the drop (activity 2).
        variant: usize,
    },
    /// A purchase in two steps: sent now (written to the gateway), answered at a later
    /// [`Op::Answer`], with other steps in between (the front judges it and the lean exchange
    /// forwards it meanwhile).
    Send {
        gw: usize,
        act: usize,
        user: usize,
        qty: u32,
        key: Option<u8>,
        variant: usize,
    },
    /// The answer of one purchase sent earlier (none if none is out).
    Answer {
        pick: usize,
    },
    HangUp {
        gw: usize,
        user: usize,
    },
    Backend {
        status: u16,
        delay_ms: u64,
    },
    AdminConfirm {
        gw: usize,
        pick: usize,
    },
    AdminRelease {
        gw: usize,
        pick: usize,
    },
    /// A reload raising an activity's version.
    Bump {
        gw: usize,
        act: usize,
    },
    /// A reload changing the per-user limit.
    Limit {
        gw: usize,
        limit: u32,
    },
    /// A restart with the other gateway's configuration, or with an older version.
    Restart {
        gw: usize,
        older: bool,
    },
}

/// Mostly one unit, so that a keyed retry is not simply refused for the limit.
fn qty() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(1u32), 1 => Just(2)]
}

fn op() -> impl Strategy<Value = Op> {
    let gw = 0..2usize;
    prop_oneof![
        10 => (gw.clone(), 0..3usize, 0..USERS, qty(), proptest::option::weighted(0.5, 0..2u8), 0..2usize)
            .prop_map(|(gw, act, user, qty, key, variant)| Op::Buy { gw, act, user, qty, key, variant }),
        6 => (gw.clone(), 0..3usize, 0..USERS, qty(), proptest::option::weighted(0.5, 0..2u8), 0..2usize)
            .prop_map(|(gw, act, user, qty, key, variant)| Op::Send { gw, act, user, qty, key, variant }),
        6 => any::<usize>().prop_map(|pick| Op::Answer { pick }),
        2 => (gw.clone(), 0..USERS).prop_map(|(gw, user)| Op::HangUp { gw, user }),
        2 => (prop_oneof![Just(200u16), Just(500), Just(409)], prop_oneof![Just(0u64), Just(200)])
            .prop_map(|(status, delay_ms)| Op::Backend { status, delay_ms }),
        2 => (gw.clone(), any::<usize>()).prop_map(|(gw, pick)| Op::AdminConfirm { gw, pick }),
        2 => (gw.clone(), any::<usize>()).prop_map(|(gw, pick)| Op::AdminRelease { gw, pick }),
        1 => (gw.clone(), 0..3usize).prop_map(|(gw, act)| Op::Bump { gw, act }),
        1 => (gw.clone(), 1..=LIMIT).prop_map(|(gw, limit)| Op::Limit { gw, limit }),
        1 => (gw, any::<bool>()).prop_map(|(gw, older)| Op::Restart { gw, older }),
    ]
}

const ACTS: [&str; 3] = ["plain", "split", "drop"];
/// The drop's variants and their stock.
const VARIANTS: [(&str, u64); 2] = [("a", 4), ("b", 5)];

fn activities(versions: [u64; 3], limit: u32) -> Vec<TestActivity> {
    vec![
        TestActivity {
            version: versions[0],
            per_user_limit: limit,
            max_per_request: limit.min(2),
            hold_secs: Some(2),
            ..TestActivity::open("plain", 8)
        },
        TestActivity {
            version: versions[1],
            per_user_limit: limit,
            max_per_request: limit.min(2),
            hold_secs: Some(2),
            segments: Some(3),
            confirm: Some("explicit"),
            ..TestActivity::open("split", 9)
        },
        TestActivity {
            version: versions[2],
            per_user_limit: limit,
            max_per_request: limit.min(2),
            hold_secs: Some(2),
            segments: Some(2),
            ..TestActivity::open("drop", 0)
        },
    ]
}

/// A purchase written to a gateway, its answer still to be read.
struct Sent {
    act: usize,
    user: usize,
    key: Option<u8>,
    answer: tokio::task::JoinHandle<std::io::Result<HttpResponse>>,
}

/// A record's state, when it was made, and when it ended (Redis's clock, ms; see lua/lib.lua).
fn life(rec: &str) -> (String, u64, Option<u64>) {
    let fields: Vec<&str> = rec.split('|').collect();
    (
        fields[0].to_owned(),
        fields[3].parse().unwrap(),
        fields[5].parse().ok(),
    )
}

struct Run {
    redis: RedisServer,
    upstream: Upstream,
    gws: Vec<GatewayProc>,
    versions: [[u64; 3]; 2],
    limits: [u32; 2],
    /// Every reservation id a buyer got, with its activity.
    jtis: Vec<(usize, String)>,
    /// (activity, user, key) -> every reservation purchases with that key got.
    keyed: HashMap<(usize, usize, u8), Vec<String>>,
    /// Purchases sent and not yet answered.
    sent: Vec<Sent>,
    store: flashgate::stock::StockStore,
}

fn config(
    run_redis: &RedisServer,
    upstream: &Upstream,
    versions: [u64; 3],
    limit: u32,
) -> TestConfig {
    let mut c = TestConfig::new(run_redis, upstream, activities(versions, limit));
    c.per_user = None;
    let variants: Vec<serde_json::Value> = VARIANTS
        .iter()
        .map(|(id, stock)| serde_json::json!({"id": id, "stock": stock}))
        .collect();
    c = c
        .set("/activities/2/stock", serde_json::Value::Null)
        .set("/activities/2/variants", serde_json::json!(variants))
        .set("/sale_routes/0/variant_query", serde_json::json!("variant"));
    c = c.order_lookup(OrderLookup::new(500, 300));
    c = c.prewarm_interval_ms(300);
    c.read_timeout_ms = 1000;
    c
}

/// The record of reservation `jti` in the segment `tag` (of the variant the id names).
fn record(redis: &RedisServer, tag: &str, jti: &str) -> Option<String> {
    let lane = flashgate::reservation::Reservation::variant_of(jti)
        .map(|v| format!(":~{v}"))
        .unwrap_or_default();
    redis::cmd("HGET")
        .arg(format!("fg:{{{tag}}}{lane}:res"))
        .arg(jti)
        .query(&mut redis.conn())
        .unwrap()
}

/// Segments of each activity.
const SEGMENTS: [u32; 3] = [1, 3, 2];

/// The hash tag of the segment a reservation id names.
fn tag_of(act: usize, jti: &str) -> String {
    match SEGMENTS[act] {
        1 => ACTS[act].to_owned(),
        n => {
            let seg = flashgate::reservation::Reservation::segment_of(jti).expect("a segment");
            format!("{}~{seg}/{n}", ACTS[act])
        }
    }
}

impl Run {
    async fn start() -> Run {
        let redis = RedisServer::start_durable();
        let upstream = Upstream::start();
        let base = config(&redis, &upstream, [1, 1, 1], LIMIT);
        let mut second = base.clone();
        second = second.on_new_ports();
        let store = stock_store(redis.url(), vec![], Duration::from_secs(2));
        Run {
            gws: vec![GatewayProc::start(base), GatewayProc::start(second)],
            redis,
            upstream,
            versions: [[1, 1, 1]; 2],
            limits: [LIMIT; 2],
            jtis: Vec::new(),
            keyed: HashMap::new(),
            sent: Vec::new(),
            store,
        }
    }

    fn reconfigure(&mut self, gw: usize, restart: bool) {
        let mut c = config(
            &self.redis,
            &self.upstream,
            self.versions[gw],
            self.limits[gw],
        );
        c.listen_port = self.gws[gw].config.listen_port;
        c.admin_port = self.gws[gw].config.admin_port;
        if restart {
            self.gws[gw].kill();
            self.gws[gw].config = c;
            self.gws[gw].restart();
        } else {
            self.gws[gw].rewrite_config(c);
            self.gws[gw].signal("HUP");
        }
    }

    async fn apply(&mut self, op: &Op) {
        match *op {
            Op::Buy {
                gw,
                act,
                user,
                qty,
                key,
                variant,
            }
            | Op::Send {
                gw,
                act,
                user,
                qty,
                key,
                variant,
            } => {
                let sent = self.send(gw, act, user, qty, key, variant).await;
                if matches!(op, Op::Buy { .. }) {
                    self.take_answer(sent, true).await;
                } else {
                    self.sent.push(sent);
                }
            }
            Op::Answer { pick } => {
                if self.sent.is_empty() {
                    return;
                }
                let sent = self.sent.remove(pick % self.sent.len());
                self.take_answer(sent, false).await;
            }
            Op::HangUp { gw, user } => {
                let before = self.upstream.requests().await.len();
                let mut s = tokio::net::TcpStream::connect(self.gws[gw].addr)
                    .await
                    .unwrap();
                let raw = raw_request(
                    "POST",
                    "/api/seckill/plain/buy",
                    &[("X-User-Id", &format!("u{user}"))],
                );
                s.write_all(raw.as_bytes()).await.unwrap();
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                loop {
                    let mut probe = [0u8; 1];
                    let answered = matches!(
                        tokio::time::timeout(Duration::from_millis(5), s.peek(&mut probe)).await,
                        Ok(Ok(n)) if n > 0
                    );
                    if answered
                        || self.upstream.requests().await.len() > before
                        || std::time::Instant::now() > deadline
                    {
                        break;
                    }
                }
            }
            Op::Backend { status, delay_ms } => {
                request(
                    self.upstream.addr,
                    "POST",
                    &format!("/__upstream/mode?status={status}&delay_ms={delay_ms}"),
                    &[],
                )
                .await;
            }
            Op::AdminConfirm { gw, pick } | Op::AdminRelease { gw, pick } => {
                if self.jtis.is_empty() {
                    return;
                }
                let (act, jti) = self.jtis[pick % self.jtis.len()].clone();
                let verb = if matches!(op, Op::AdminConfirm { .. }) {
                    "confirm"
                } else {
                    "release"
                };
                let resp = self.gws[gw]
                    .admin_post(&format!(
                        "/v1/activities/{}/reservations/{jti}/{verb}",
                        ACTS[act]
                    ))
                    .await;
                assert!(
                    matches!(resp.status, 200 | 404 | 409 | 503),
                    "{verb}: {}",
                    resp.status
                );
            }
            Op::Bump { gw, act } => {
                self.versions[gw][act] += 1;
                self.reconfigure(gw, false);
            }
            Op::Limit { gw, limit } => {
                self.limits[gw] = limit;
                self.reconfigure(gw, false);
            }
            Op::Restart { gw, older } => {
                if older {
                    for v in &mut self.versions[gw] {
                        *v = v.saturating_sub(1).max(1);
                    }
                } else {
                    self.versions[gw] = self.versions[1 - gw];
                }
                self.reconfigure(gw, true);
            }
        }
    }

    /// Writes a purchase to gateway `gw`; its answer is read by [`Run::take_answer`].
    async fn send(
        &mut self,
        gw: usize,
        act: usize,
        user: usize,
        qty: u32,
        key: Option<u8>,
        variant: usize,
    ) -> Sent {
        let raw = purchase(act, user, qty, key, variant);
        let mut stream = tokio::net::TcpStream::connect(self.gws[gw].addr)
            .await
            .unwrap();
        stream.write_all(raw.as_bytes()).await.unwrap();
        let answer = tokio::spawn(async move { send_on(&mut stream, b"").await });
        Sent {
            act,
            user,
            key,
            answer,
        }
    }

    /// Reads a sent purchase's answer. A gateway killed since it was sent answers nothing;
    /// `must`: it was sent just now, to a gateway that is up, so it must be answered.
    async fn take_answer(&mut self, sent: Sent, must: bool) {
        match sent.answer.await.unwrap() {
            Ok(resp) => self.answered(sent.act, sent.user, sent.key, &resp),
            Err(e) => assert!(!must, "a purchase got no answer: {e}"),
        }
    }

    /// Takes note of a purchase's answer: the reservation it got, and for a keyed one, that
    /// of every two reservations its key got the older was released before the newer was made
    /// (whatever order their answers were read in).
    fn answered(&mut self, act: usize, user: usize, key: Option<u8>, resp: &HttpResponse) {
        let Some(jti) = resp.header("x-flashgate-reservation-id").map(str::to_owned) else {
            return;
        };
        if let Some(k) = key {
            let got = self.keyed.entry((act, user, k)).or_default();
            if !got.contains(&jti) {
                let rec = |jti: &str| {
                    record(&self.redis, &tag_of(act, jti), jti)
                        .unwrap_or_else(|| panic!("no record of {jti}"))
                };
                let (_, made, _) = life(&rec(&jti));
                for other in got.iter() {
                    let (state, other_made, ended) = life(&rec(other));
                    let (older, older_state, older_ended, newer_made) = if other_made <= made {
                        (other.as_str(), state, ended, made)
                    } else {
                        let (s, _, e) = life(&rec(&jti));
                        (jti.as_str(), s, e, other_made)
                    };
                    assert!(
                        older_state == "released" && older_ended.is_some_and(|t| t <= newer_made),
                        "key-{k} of u{user} got {jti} and {other}: {older} was {older_state} \
                         (ended {older_ended:?}) when the other was made at {newer_made}"
                    );
                }
                got.push(jti.clone());
            }
        }
        self.jtis.push((act, jti));
    }

    /// The settings that read Redis as it is (versions do not matter to reconcile).
    fn settings(&self) -> flashgate::config::Settings {
        flashgate::config::Settings::load_without_secrets(&self.gws[0].config_path()).unwrap()
    }

    async fn check(&self) {
        let settings = self.settings();
        let report = flashgate::reconcile::reconcile(&settings, &self.store, None)
            .await
            .unwrap();
        assert!(report.clean(), "{}", report.table());
        for v in &report.versions {
            assert!(
                v.ledger.pending + v.ledger.confirmed <= v.ledger.initial + v.ledger.moved_in,
                "{}",
                report.table()
            );
        }
        let mut conn = self.redis.conn();
        for (act, tags) in [
            (0, vec!["plain".to_owned()]),
            (1, (0..3).map(|s| format!("split~{s}/3")).collect()),
            // The drop's buyers' units are the activity's, across its variants.
            (2, (0..2).map(|s| format!("drop~{s}/2")).collect::<Vec<_>>()),
        ] {
            let mut held: HashMap<String, u64> = HashMap::new();
            for tag in tags {
                let users: HashMap<String, String> = redis::cmd("HGETALL")
                    .arg(format!("fg:{{{tag}}}:users"))
                    .query(&mut conn)
                    .unwrap();
                for (u, n) in users.into_iter().filter(|(u, _)| !u.is_empty()) {
                    *held.entry(u).or_default() += n.parse::<u64>().unwrap();
                }
            }
            for (user, units) in held {
                assert!(
                    units <= u64::from(LIMIT),
                    "{} {user} holds {units}",
                    ACTS[act]
                );
            }
        }
    }

    /// Waits until nothing is pending (every hold settled), then: every order the backend
    /// took is confirmed.
    async fn settle(&self) {
        request(
            self.upstream.addr,
            "POST",
            "/__upstream/mode?status=200&delay_ms=0",
            &[],
        )
        .await;
        let settings = self.settings();
        wait_for_async("every hold to settle", Duration::from_secs(30), || async {
            let report = flashgate::reconcile::reconcile(&settings, &self.store, None)
                .await
                .ok()?;
            report
                .versions
                .iter()
                .all(|v| v.ledger.pending == 0)
                .then_some(())
        })
        .await;
        let orders = get(self.upstream.addr, "/__upstream/orders", &[])
            .await
            .json();
        for jti in orders["orders"].as_array().unwrap() {
            let jti = jti.as_str().unwrap();
            let act = self.jtis.iter().find(|(_, j)| j == jti).map_or_else(
                || match (jti.contains('~'), jti.contains('.')) {
                    (true, _) => 2,
                    (false, true) => 1,
                    (false, false) => 0,
                },
                |(a, _)| *a,
            );
            let rec = record(&self.redis, &tag_of(act, jti), jti).unwrap_or_default();
            // An admin release (a cancelled order) is the backend's own doing.
            assert!(
                rec.starts_with("confirmed|") || rec.contains("|admin|"),
                "the backend took {jti} but Redis says {rec:?}"
            );
        }
        self.check().await;
    }
}

/// A purchase request as a buyer's client writes it (naming `variant` on the drop).
fn purchase(act: usize, user: usize, qty: u32, key: Option<u8>, variant: usize) -> String {
    let user_id = format!("u{user}");
    let mut path = format!("/api/seckill/{}/buy?qty={qty}", ACTS[act]);
    if act == 2 {
        path.push_str(&format!("&variant={}", VARIANTS[variant].0));
    }
    let key_header = key.map(|k| format!("key-{k}"));
    let mut headers = vec![("X-User-Id", user_id.as_str())];
    if let Some(k) = &key_header {
        headers.push(("Idempotency-Key", k.as_str()));
    }
    raw_request("POST", &path, &headers)
}

proptest! {
    #![proptest_config(support::generated::sequences(3, 64))]

    #[test]
    fn two_gateways_over_http_keep_every_invariant(ops in proptest::collection::vec(op(), 10..40)) {
        play(&ops);
    }
}

/// Runs `ops` on two fresh gateways, checking the invariants after every step, then reads every
/// answer still out and lets every hold settle; what each idempotency key won.
fn play(ops: &[Op]) -> HashMap<(usize, usize, u8), Vec<String>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut run = Run::start().await;
        for op in ops {
            run.apply(op).await;
            run.check().await;
        }
        for sent in std::mem::take(&mut run.sent) {
            run.take_answer(sent, false).await;
        }
        run.settle().await;
        std::mem::take(&mut run.keyed)
    })
}

/// A fixed sequence the generator can make: a keyed purchase, its retry sent and answered
/// around a backend failure and another buyer, then the retry of a purchase that was sold.
/// Each retry must get the first one's reservation (or a new one only after it was released).
#[test]
fn keyed_retries_in_two_steps_get_the_same_reservation() {
    let buy = |gw, user, qty, key| Op::Buy {
        gw,
        act: 0,
        user,
        qty,
        key,
        variant: 0,
    };
    let send = |gw, user, key| Op::Send {
        gw,
        act: 0,
        user,
        qty: 1,
        key,
        variant: 0,
    };
    let ops = [
        buy(0, 0, 1, Some(0)),
        send(1, 0, Some(0)),
        Op::Backend {
            status: 500,
            delay_ms: 0,
        },
        send(0, 1, Some(1)),
        Op::Answer { pick: 0 },
        buy(1, 1, 1, Some(1)),
        Op::Answer { pick: 0 },
        buy(0, 0, 1, Some(0)),
    ];
    let keyed = play(&ops);
    // u0's key won one reservation, whatever its retries were answered.
    assert_eq!(keyed.get(&(0, 0, 0)).map(Vec::len), Some(1), "{keyed:?}");
}

/// The drop: one idempotency key retried naming the other variant is not its retry (400), and
/// the retry naming the same variant gets the same reservation; the buyer's units across both
/// variants stay within the limit.
#[test]
fn a_keyed_retry_on_the_drop_keeps_its_variant() {
    let buy = |gw, user, key, variant| Op::Buy {
        gw,
        act: 2,
        user,
        qty: 1,
        key,
        variant,
    };
    let ops = [
        buy(0, 0, Some(0), 0),
        buy(1, 0, Some(0), 1),
        buy(1, 0, Some(0), 0),
        buy(0, 0, None, 1),
        buy(0, 0, None, 1),
    ];
    let keyed = play(&ops);
    assert_eq!(keyed.get(&(2, 0, 0)).map(Vec::len), Some(1), "{keyed:?}");
}
