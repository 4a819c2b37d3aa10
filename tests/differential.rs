//! The batched reserve against its specification, differentially (written by an adversarial
//! review of d5cb8b2, where reserve.lua began to gather its writes; kept).
//!
//! `differential_*`: random histories run on three activities of one real redis-server:
//!   A: every batch item as its own call of today's reserve.lua (separate calls, the spec),
//!   B: every batch as ONE call of today's reserve.lua (gathered writes),
//!   C: every batch as ONE call of d878dcf's reserve.lua (per-item writes), as an oracle.
//! Between batches the same releases, confirms, sweeps, expired deadlines, abandons (tombstones),
//! version bumps and lost ledgers are applied to all three. After every step each reply and the
//! whole Redis state (stock, ledgers, users, records, idem, pending members, received, events)
//! must be the same, modulo times.
//!
//! Run: `timeout 900 cargo test --test differential -- --nocapture`
//! More: `REVIEW_SEEDS=200 REVIEW_STEPS=120 timeout 900 cargo test --test differential`

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, ConfirmMode};
use flashgate::stock::prelude::*;
use flashgate::stock::segments;
use flashgate::stock::{ConfirmedVia, Layout, ReleaseMode, ReleaseReason, StockStore};
use redis::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use support::*;

const LIB: &str = include_str!("../lua/lib.lua");
const NEW: &str = include_str!("../lua/reserve.lua");
const OLD: &str = include_str!("fixtures/reserve_per_item_d878dcf.lua");

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

#[derive(Debug, Clone)]
struct Item {
    user: String,
    qty: u32,
    limit: u32,
    jti: String,
    key: Option<String>,
    transfer: Option<(String, u64)>,
    hold_ms: u64,
    in_flight_ms: u64,
    replay_only: bool,
    opens: i64,
    closes: i64,
}

fn keys(act: &str, ver: u64) -> Vec<String> {
    let b = format!("fg:{{{act}}}");
    vec![
        format!("{b}:v{ver}:stock"),
        format!("{b}:users"),
        format!("{b}:res"),
        format!("{b}:v{ver}:ledger"),
        format!("{b}:v{ver}:pending"),
        format!("{b}:idem"),
        format!("{b}:events"),
        format!("{b}:received"),
        // The failover fence's record and what the gateways know of the segment (today's
        // script only; never written by it here).
        format!("{b}:master"),
        format!("{b}:known"),
    ]
}

/// Today's script's arguments: the old one's, with the master the gateway saw (none) third,
/// the records it saw the segment hold (none), their life and the version it sold in it
/// fourth to sixth.
fn new_args(ver: u64, items: &[Item]) -> Vec<String> {
    let mut a = vec![ver.to_string(), "1000".to_string()];
    a.extend([String::new(), "0".to_owned(), String::new(), "0".to_owned()]);
    for i in items {
        // The older script's 12 arguments an item, then the steps (none: no phases).
        a.extend(args(ver, std::slice::from_ref(i)).into_iter().skip(2));
        a.push(String::new());
    }
    a
}

fn args(ver: u64, items: &[Item]) -> Vec<String> {
    let mut a = vec![ver.to_string(), "1000".to_string()];
    for i in items {
        a.push(i.user.clone());
        a.push(i.qty.to_string());
        a.push(i.limit.to_string());
        a.push(i.jti.clone());
        a.push(i.hold_ms.to_string());
        a.push(
            i.key
                .as_ref()
                .map(|k| format!("{}\n{k}", i.user))
                .unwrap_or_default(),
        );
        let (t, u) = i.transfer.clone().unwrap_or_default();
        a.push(t);
        a.push(u.to_string());
        a.push(i.in_flight_ms.to_string());
        a.push(if i.replay_only { "1" } else { "0" }.into());
        a.push(i.opens.to_string());
        a.push(i.closes.to_string());
    }
    a
}

fn s(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(x) => x.clone(),
        Value::Nil => "nil".into(),
        other => format!("{other:?}"),
    }
}

fn num(x: &str) -> i64 {
    x.parse().unwrap_or(0)
}

/// One item's reply with times made relative (deadline - created).
fn norm_reply(v: &Value) -> Vec<String> {
    let Value::Array(f) = v else {
        return vec![format!("{v:?}")];
    };
    let f: Vec<String> = f.iter().map(s).collect();
    match f[0].as_str() {
        "1" => vec![
            f[0].clone(),
            f[1].clone(),
            f[2].clone(),
            (num(&f[4]) - num(&f[3])).to_string(),
            f[5].clone(),
        ],
        "2" => vec![
            f[0].clone(),
            f[1].clone(),
            f[2].clone(),
            f[3].clone(),
            f[4].clone(),
            if f[6] == "1" {
                "EXPIRED".to_string()
            } else {
                (num(&f[6]) - num(&f[5])).to_string()
            },
            f[7].clone(),
        ],
        _ => f,
    }
}

fn bucket(x: &str, created: i64) -> String {
    if x == "0" || x.is_empty() {
        return x.to_string();
    }
    (((num(x) - created) + 5_000).div_euclid(10_000)).to_string()
}

/// A record with times made relative to its creation.
fn norm_record(raw: &str) -> String {
    let p: Vec<&str> = raw.splitn(12, '|').collect();
    if p.len() < 12 || p[3].is_empty() {
        return raw
            .split('|')
            .enumerate()
            .map(|(i, x)| if i == 5 { "T" } else { x })
            .collect::<Vec<_>>()
            .join("|");
    }
    let created = num(p[3]);
    let dl = if p[4] == "1" {
        "EXPIRED".to_string()
    } else {
        (num(p[4]) - created).to_string()
    };
    format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
        p[0],
        p[1],
        p[2],
        dl,
        !p[5].is_empty(),
        p[6],
        sorted_flags(p[7]),
        p[8],
        bucket(p[9], created),
        bucket(p[10], created),
        p[11]
    )
}

/// Flags as a set: a record made and replayed in one batch is written "rf", by separate calls
/// "fr" (a byte difference only: every reader asks whether a flag is present).
fn sorted_flags(f: &str) -> String {
    let mut c: Vec<char> = f.chars().collect();
    c.sort();
    c.into_iter().collect()
}

fn hgetall(conn: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(conn).unwrap()
}

/// The state of one activity (versions 1..=max), normalised; and a list of inconsistencies
/// found inside it (pending scores that are not max(deadline, busy), keys without expiry).
fn dump(conn: &mut redis::Connection, act: &str, max: u64) -> (String, Vec<String>) {
    let b = format!("fg:{{{act}}}");
    let mut out = String::new();
    let mut bad = Vec::new();
    let mut res = hgetall(conn, &format!("{b}:res"));
    // The placeholder's value names the records' life (Redis's time when it was made): the
    // same shape in every activity, never the same value.
    if let Some(life) = res.get_mut("") {
        *life = if life.is_empty() { "" } else { "<life>" }.to_owned();
    }
    for v in 1..=max {
        let stock: Option<String> = redis::cmd("GET")
            .arg(format!("{b}:v{v}:stock"))
            .query(conn)
            .unwrap();
        out += &format!("v{v} stock {stock:?}\n");
        // Less the report's sell-out time: a reading of Redis's clock (separate calls read it
        // later than a batch) that the old script never wrote (tests/e2e/report.rs checks it).
        let mut ledger = hgetall(conn, &format!("{b}:v{v}:ledger"));
        ledger.remove("sold_out_ms");
        out += &format!("v{v} ledger {ledger:?}\n");
        let pend: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(format!("{b}:v{v}:pending"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(conn)
            .unwrap();
        let mut members: Vec<&str> = pend.iter().map(|(m, _)| m.as_str()).collect();
        members.sort();
        out += &format!("v{v} pending {members:?}\n");
        for (m, score) in &pend {
            if m.is_empty() {
                continue;
            }
            match res.get(m) {
                Some(raw) => {
                    let p: Vec<&str> = raw.splitn(12, '|').collect();
                    if p[0] != "pending" {
                        bad.push(format!("{act}: {m} in v{v} pending but {}", p[0]));
                    }
                    if p[2] != v.to_string() {
                        bad.push(format!("{act}: {m} of v{} in v{v}'s pending", p[2]));
                    }
                    let want = num(p[4]).max(num(p[10]));
                    if *score as i64 != want && p[4] != "1" {
                        bad.push(format!(
                            "{act}: {m} due {score} but max(deadline, busy) = {want} ({raw})"
                        ));
                    }
                }
                None => bad.push(format!("{act}: {m} pending without a record")),
            }
        }
    }
    // Every pending record is in its version's pending set.
    for (jti, raw) in &res {
        let p: Vec<&str> = raw.splitn(12, '|').collect();
        if p[0] == "pending" {
            let score: Option<f64> = redis::cmd("ZSCORE")
                .arg(format!("{b}:v{}:pending", p[2]))
                .arg(jti)
                .query(conn)
                .unwrap();
            if score.is_none() {
                bad.push(format!("{act}: pending {jti} in no pending set"));
            }
        }
    }
    let res: BTreeMap<&String, String> = res.iter().map(|(k, v)| (k, norm_record(v))).collect();
    out += &format!("res {res:#?}\n");
    out += &format!("users {:?}\n", hgetall(conn, &format!("{b}:users")));
    out += &format!("idem {:?}\n", hgetall(conn, &format!("{b}:idem")));
    out += &format!("received {:?}\n", hgetall(conn, &format!("{b}:received")));
    let events: Vec<(String, Vec<String>)> = {
        let v: Value = redis::cmd("XRANGE")
            .arg(format!("{b}:events"))
            .arg("-")
            .arg("+")
            .query(conn)
            .unwrap();
        let mut out = Vec::new();
        if let Value::Array(entries) = v {
            for e in entries {
                if let Value::Array(pair) = e {
                    if let Value::Array(fs) = &pair[1] {
                        let fs: Vec<String> = fs.iter().map(s).collect();
                        out.extend(per_reservation(&fs).into_iter().map(|f| (String::new(), f)));
                    }
                }
            }
        }
        out
    };
    let events: Vec<&Vec<String>> = events.iter().map(|(_, f)| f).collect();
    out += &format!("events {events:?}\n");
    let all: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{b}:*"))
        .query(conn)
        .unwrap();
    for k in all {
        let t: i64 = redis::cmd("EXPIRETIME").arg(&k).query(conn).unwrap();
        if t == -1 && !k.ends_with(":floor") {
            bad.push(format!("{k} has no expiry"));
        }
    }
    (out, bad)
}

fn act(id: &str, ver: u64, stock: u64) -> Activity {
    store_activity(
        id,
        stock,
        ver,
        4,
        ConfirmMode::Upstream,
        Duration::from_secs(900),
    )
}

static CODES: std::sync::Mutex<BTreeMap<String, usize>> = std::sync::Mutex::new(BTreeMap::new());

const ACTS: [&str; 3] = ["A", "B", "C"];

fn gen_item(r: &mut Rng, next_jti: &mut u32) -> Item {
    let user = format!("u{}", 1 + r.below(6));
    let jti = if r.chance(15) && *next_jti > 1 {
        format!("r{}", 1 + r.below(*next_jti as u64))
    } else {
        *next_jti += 1;
        format!("r{}", *next_jti)
    };
    let key = if r.chance(55) {
        Some(format!("k{}", 1 + r.below(3)))
    } else {
        None
    };
    let transfer = if r.chance(15) {
        Some((format!("t{}", 1 + r.below(6)), 1 + r.below(3)))
    } else {
        None
    };
    let (opens, closes) = match r.below(100) {
        0..=6 => (0, 1),                         // closed
        7..=13 => (4_102_444_800_000, i64::MAX), // opens in 2100
        _ => (i64::MIN, i64::MAX),
    };
    Item {
        user,
        qty: 1 + r.below(3) as u32,
        limit: [3, 4, 6, 8][r.below(4) as usize],
        jti,
        key,
        transfer,
        hold_ms: [60_000, 900_000][r.below(2) as usize],
        in_flight_ms: [0, 0, 2_000_000][r.below(3) as usize],
        replay_only: r.chance(10),
        opens,
        closes,
    }
}

async fn run_seed(
    redis: &RedisServer,
    st: &StockStore,
    seed: u64,
    steps: usize,
) -> Result<(), String> {
    let mut conn = redis.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let new = redis::Script::new(&format!("{LIB}\n{NEW}"));
    let old = redis::Script::new(&format!("{LIB}\n{OLD}"));
    let mut r = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    let initial = 3 + r.below(10);
    let mut ver = 1u64;
    for a in ACTS {
        segments::prewarm(st, &act(a, 1, initial))
            .await
            .unwrap()
            .unwrap();
    }
    let mut next_jti = 0u32;
    let mut log = Vec::new();
    let mut damaged = false;
    // The version whose ledger was deleted (op 98): from then on the old script is no oracle
    // for it (it made the ledger again without its `initial`, the drift issue 45 fixed); today's
    // refuses the segment as damaged and takes nothing.
    let mut ledger_gone: Option<u64> = None;
    for step in 0..steps {
        let roll = r.below(100);
        if roll < 60 {
            let n = if r.chance(10) {
                1 + r.below(32)
            } else {
                1 + r.below(10)
            } as usize;
            let items: Vec<Item> = (0..n).map(|_| gen_item(&mut r, &mut next_jti)).collect();
            let v = if ver > 1 && r.chance(20) {
                1 + r.below(ver)
            } else {
                ver
            };
            log.push(format!("step {step}: batch v{v} {items:?}"));
            // A: separate calls.
            let mut ra = Vec::new();
            for it in &items {
                let mut inv = new.prepare_invoke();
                for k in keys("A", v) {
                    inv.key(k);
                }
                for x in new_args(v, std::slice::from_ref(it)) {
                    inv.arg(x);
                }
                let reply: Value = inv
                    .invoke(&mut conn)
                    .map_err(|e| format!("A: {e}\n{}", log.join("\n")))?;
                let Value::Array(mut one) = reply else {
                    panic!()
                };
                ra.push(norm_reply(&one.remove(0)));
            }
            let mut batch = |script: &redis::Script, a: &str| -> Result<Vec<Vec<String>>, String> {
                let mut inv = script.prepare_invoke();
                for k in keys(a, v) {
                    inv.key(k);
                }
                let argv = if std::ptr::eq(script, &new) {
                    new_args(v, &items)
                } else {
                    args(v, &items)
                };
                for x in argv {
                    inv.arg(x);
                }
                let reply: Value = inv
                    .invoke(&mut conn)
                    .map_err(|e| format!("{a}: {e}\n{}", log.join("\n")))?;
                let Value::Array(all) = reply else { panic!() };
                Ok(all.iter().map(norm_reply).collect())
            };
            let rb = batch(&new, "B")?;
            let rc = batch(&old, "C")?;
            for x in &ra {
                let code = if x[0] == "-7" {
                    format!("-7/{}", x[1])
                } else {
                    x[0].clone()
                };
                *CODES.lock().unwrap().entry(code).or_default() += 1;
            }
            let oracle = ledger_gone.is_none();
            for (i, it) in items.iter().enumerate() {
                let took = ra[i][0] == "1" || ra[i][0] == "2";
                if ra[i] != rb[i] || (oracle && ra[i] != rc[i]) || (ledger_gone == Some(v) && took)
                {
                    return Err(format!(
                        "seed {seed} step {step} item {i} {it:?}\n separate {:?}\n batched  {:?}\n old      {:?}\n{}",
                        ra[i],
                        rb[i],
                        rc[i],
                        log.join("\n")
                    ));
                }
            }
        } else {
            // The same change on every activity.
            let kind = r.below(100);
            let pick = 1 + r.below(next_jti.max(1) as u64);
            let jti = format!("r{pick}");
            log.push(format!("step {step}: op {kind} on {jti}"));
            for a in ACTS {
                let activity = act(a, ver, initial);
                let layout = Layout::of(&activity);
                let seg = layout.segment(0).unwrap();
                let rec: Option<String> = redis::cmd("HGET")
                    .arg(format!("fg:{{{a}}}:res"))
                    .arg(&jti)
                    .query(&mut conn)
                    .unwrap();
                let rver = rec
                    .as_ref()
                    .and_then(|x| x.split('|').nth(2))
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(ver);
                match kind {
                    0..=29 => {
                        let _ = st
                            .release(seg, rver, &jti, ReleaseMode::Admin, ReleaseReason::Admin)
                            .await
                            .unwrap();
                    }
                    30..=54 => {
                        let _ = st
                            .confirm(seg, rver, &[&jti], ConfirmedVia::Admin)
                            .await
                            .unwrap();
                    }
                    55..=69 => {
                        // The hold ran out.
                        if let Some(raw) = &rec {
                            let mut p: Vec<&str> = raw.splitn(12, '|').collect();
                            if p[0] == "pending" {
                                p[4] = "1";
                                let _: () = redis::cmd("HSET")
                                    .arg(format!("fg:{{{a}}}:res"))
                                    .arg(&jti)
                                    .arg(p.join("|"))
                                    .query(&mut conn)
                                    .unwrap();
                            }
                        }
                    }
                    70..=79 => {
                        for v in 1..=ver {
                            let _ = st.sweep(seg, v, 100, None).await.unwrap();
                        }
                    }
                    80..=87 => {
                        // An abandon of an id never reserved: a tombstone (a later reserve: -4).
                        let fresh = format!("r{}", next_jti + 1);
                        let _ = st
                            .release(
                                seg,
                                ver,
                                &fresh,
                                ReleaseMode::Abandon,
                                ReleaseReason::StoreTimeout,
                            )
                            .await
                            .unwrap();
                    }
                    88..=97 => {
                        if ver < 3 && !damaged {
                            let _ = segments::prewarm(st, &act(a, ver + 1, initial + 2))
                                .await
                                .unwrap();
                        }
                    }
                    98 => {
                        if a == "A" {
                            damaged = true;
                            ledger_gone = Some(ver);
                        }
                        let _: () = redis::cmd("DEL")
                            .arg(format!("fg:{{{a}}}:v{ver}:ledger"))
                            .query(&mut conn)
                            .unwrap();
                    }
                    _ => {
                        // The received book lost: deposits refused (-7/-2).
                        if a == "A" {
                            damaged = true;
                        }
                        let _: () = redis::cmd("DEL")
                            .arg(format!("fg:{{{a}}}:received"))
                            .query(&mut conn)
                            .unwrap();
                    }
                }
            }
            if (88..=97).contains(&kind) && ver < 3 && !damaged {
                ver += 1;
            }
            if kind == 80 || (81..=87).contains(&kind) {
                next_jti += 1;
            }
        }
        let (da, ba) = dump(&mut conn, "A", ver);
        let (db, bb) = dump(&mut conn, "B", ver);
        let (dc, bc) = dump(&mut conn, "C", ver);
        let bad: Vec<String> = ba
            .into_iter()
            .chain(bb)
            .chain(bc)
            .filter(|b| !(damaged && b.contains("ledger has no expiry")))
            .collect();
        if da != db || (ledger_gone.is_none() && da != dc) || !bad.is_empty() {
            let diff = |x: &str, y: &str| -> String {
                x.lines()
                    .zip(y.lines())
                    .filter(|(p, q)| p != q)
                    .map(|(p, q)| format!("  - {p}\n  + {q}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            return Err(format!(
                "seed {seed} after step {step}: states differ or are inconsistent\nA vs B:\n{}\nA vs C:\n{}\nbad: {bad:#?}\n{}",
                diff(&da, &db),
                diff(&da, &dc),
                log.join("\n")
            ));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_batches_equal_separate_calls_and_the_old_script() {
    let redis = RedisServer::start();
    let seeds: u64 = std::env::var("REVIEW_SEEDS")
        .ok()
        .and_then(|x| x.parse().ok())
        .unwrap_or(20);
    let steps: usize = std::env::var("REVIEW_STEPS")
        .ok()
        .and_then(|x| x.parse().ok())
        .unwrap_or(60);
    let first: u64 = std::env::var("REVIEW_SEED0")
        .ok()
        .and_then(|x| x.parse().ok())
        .unwrap_or(1);
    for seed in first..first + seeds {
        // A store of its own per seed (a gateway started afresh): each seed starts from an
        // emptied Redis, which a store that saw its versions on sale refuses to sell again.
        let st = stock_store(redis.url(), vec![], Duration::from_millis(2000));
        if let Err(e) = run_seed(&redis, &st, seed, steps).await {
            panic!("{e}");
        }
    }
    eprintln!(
        "item replies seen (code: count): {:?}",
        CODES.lock().unwrap()
    );
}

/// An event's fields as `name=value` (its time and `done` left out), a batch's `reserve` entry
/// (today's script: one entry a batch, its items' `jti`, `user` and `qty` joined by a line break)
/// as the one entry per reservation the per-item script appended, in the same order.
fn per_reservation(fs: &[String]) -> Vec<Vec<String>> {
    let kept: Vec<(&str, &str)> = fs
        .chunks(2)
        .filter(|kv| kv[0] != "ts" && kv[0] != "done")
        .map(|kv| (kv[0].as_str(), kv[1].as_str()))
        .collect();
    let of = |name: &str| kept.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    if of("type") != Some("reserve") {
        return vec![kept.iter().map(|(k, v)| format!("{k}={v}")).collect()];
    }
    let split = |name: &str| of(name).unwrap_or_default().split('\n').collect::<Vec<_>>();
    let (jtis, users, qtys) = (split("jti"), split("user"), split("qty"));
    assert!(
        jtis.len() == users.len() && users.len() == qtys.len(),
        "{fs:?}"
    );
    (0..jtis.len())
        .map(|i| {
            kept.iter()
                .map(|(k, v)| match *k {
                    "jti" => format!("jti={}", jtis[i]),
                    "user" => format!("user={}", users[i]),
                    "qty" => format!("qty={}", qtys[i]),
                    _ => format!("{k}={v}"),
                })
                .collect()
        })
        .collect()
}

fn item(user: &str, qty: u32, jti: &str) -> Item {
    Item {
        user: user.into(),
        qty,
        limit: 4,
        jti: jti.into(),
        key: None,
        transfer: None,
        hold_ms: 900_000,
        in_flight_ms: 0,
        replay_only: false,
        opens: i64::MIN,
        closes: i64::MAX,
    }
}

fn call_new(
    conn: &mut redis::Connection,
    a: &str,
    v: u64,
    items: &[Item],
) -> redis::RedisResult<Value> {
    let script = redis::Script::new(&format!("{LIB}\n{NEW}"));
    let mut inv = script.prepare_invoke();
    for k in keys(a, v) {
        inv.key(k);
    }
    for x in new_args(v, items) {
        inv.arg(x);
    }
    inv.invoke(conn)
}

/// Held: a key of another type (set by hand) refuses every item of the batch with -6, and
/// nothing at all is written (stock, users, records, events), whichever key it is. (`received`
/// matters only to a batch that deposits a transfer: the only one that writes it; a batch that
/// does not sells as usual, below.)
#[tokio::test]
async fn a_key_of_another_type_refuses_the_batch_whole_and_writes_nothing() {
    let redis = RedisServer::start();
    let st = stock_store(redis.url(), vec![], Duration::from_millis(2000));
    let mut conn = redis.conn();
    for (i, key) in ["v1:ledger", "v1:pending", "idem", "events", "received"]
        .iter()
        .enumerate()
    {
        let id = format!("X{i}");
        segments::prewarm(&st, &act(&id, 1, 5))
            .await
            .unwrap()
            .unwrap();
        let k = format!("fg:{{{id}}}:{key}");
        let _: () = redis::cmd("DEL").arg(&k).query(&mut conn).unwrap();
        let _: () = redis::cmd("SET").arg(&k).arg("x").query(&mut conn).unwrap();
        let mut first = item("u1", 1, "r1");
        if *key == "received" {
            first.transfer = Some(("t1".into(), 1));
        }
        let reply = call_new(&mut conn, &id, 1, &[first, item("u2", 1, "r2")]).unwrap();
        let Value::Array(replies) = reply else {
            panic!()
        };
        // Each item's reply, then the records the segment holds and their life.
        assert_eq!(replies.len(), 4, "{key}: {replies:?}");
        for r in &replies[..2] {
            assert_eq!(norm_reply(r)[0], "-6", "{key}: {replies:?}");
        }
        // (`dump` reads the string key as a hash: compare everything but that key.)
        let _: () = redis::cmd("DEL").arg(&k).query(&mut conn).unwrap();
        let after = dump(&mut conn, &id, 1).0;
        assert!(
            !after.contains("\"r1\"") && after.contains("v1 stock Some(\"5\")"),
            "{key}: {after}"
        );
    }
    segments::prewarm(&st, &act("Y", 1, 5))
        .await
        .unwrap()
        .unwrap();
    let k = "fg:{Y}:received";
    let _: () = redis::cmd("DEL").arg(k).query(&mut conn).unwrap();
    let _: () = redis::cmd("SET").arg(k).arg("x").query(&mut conn).unwrap();
    let reply = call_new(
        &mut conn,
        "Y",
        1,
        &[item("u1", 1, "r1"), item("u2", 1, "r2")],
    );
    let Ok(Value::Array(replies)) = reply else {
        panic!("{reply:?}")
    };
    assert!(
        replies[..2].iter().all(|r| norm_reply(r)[0] == "1"),
        "{replies:?}"
    );
}

/// Held: "the batch lands whole or not at all" holds for a Lua runtime error mid-batch too: a
/// non-number in `users` (a hand edit) makes the script fail at the second item, and nothing is
/// written, not even the first item's event (the batch's one event is written with the rest,
/// after the last item is judged). Until issue 37 the first item's event was appended as it was
/// judged, and stayed; d878dcf left r1 fully reserved. Each replies an error to all items.
#[tokio::test]
async fn a_runtime_error_mid_batch_writes_nothing_not_even_an_event() {
    let redis = RedisServer::start();
    let st = stock_store(redis.url(), vec![], Duration::from_millis(2000));
    let mut conn = redis.conn();
    segments::prewarm(&st, &act("E", 1, 5))
        .await
        .unwrap()
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("fg:{E}:users")
        .arg("u2")
        .arg("two")
        .query(&mut conn)
        .unwrap();
    eprintln!("{}", dump(&mut conn, "E", 1).0);
    let err = call_new(
        &mut conn,
        "E",
        1,
        &[item("u1", 1, "r1"), item("u2", 1, "r2")],
    );
    assert!(err.is_err(), "{err:?}");
    let events: Value = redis::cmd("XRANGE")
        .arg("fg:{E}:events")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let rec: Option<String> = redis::cmd("HGET")
        .arg("fg:{E}:res")
        .arg("r1")
        .query(&mut conn)
        .unwrap();
    let stock: String = redis::cmd("GET")
        .arg("fg:{E}:v1:stock")
        .query(&mut conn)
        .unwrap();
    eprintln!("error {err:?}\nevents {events:?}\nrecord r1 {rec:?}, stock {stock}");
    assert!(
        events == Value::Array(vec![]) && rec.is_none() && stock == "5",
        "{events:?}"
    );
}

/// Review finding (issue 37, present since the writes were gathered): a deposit wrote its
/// transfer book and the ledger's `moved_in` as it was judged, the stock with the rest; a later
/// item failing (a non-number in `users`, a hand edit) left the transfer received and counted,
/// its units never in the stock, and the transfer spent. Now a deposit's writes wait with the
/// batch's: nothing is written.
#[tokio::test]
async fn regression_a_deposit_then_an_error_midway_writes_nothing() {
    let redis = RedisServer::start();
    let st = stock_store(redis.url(), vec![], Duration::from_millis(2000));
    let mut conn = redis.conn();
    segments::prewarm(&st, &act("D", 1, 5))
        .await
        .unwrap()
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("fg:{D}:users")
        .arg("bad")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let before = dump(&mut conn, "D", 1).0;
    let mut first = item("u1", 1, "r1");
    first.transfer = Some(("t1".into(), 3));
    let err = call_new(&mut conn, "D", 1, &[first, item("bad", 1, "r2")]);
    assert!(err.is_err(), "{err:?}");
    assert_eq!(dump(&mut conn, "D", 1).0, before, "nothing written");
}

/// Review finding (issue 37): a stock Lua reads as a number but INCRBY refuses ("7.0", set by
/// hand) failed the call after the pending entry and the event were written. It is a damaged
/// segment now: -6 for every item, nothing written.
#[tokio::test]
async fn regression_a_stock_that_is_no_integer_refuses_the_batch_whole() {
    let redis = RedisServer::start();
    let st = stock_store(redis.url(), vec![], Duration::from_millis(2000));
    let mut conn = redis.conn();
    segments::prewarm(&st, &act("S", 1, 5))
        .await
        .unwrap()
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("fg:{S}:v1:stock")
        .arg("7.0")
        .query(&mut conn)
        .unwrap();
    let before = dump(&mut conn, "S", 1).0;
    let reply = call_new(
        &mut conn,
        "S",
        1,
        &[item("u1", 1, "r1"), item("u2", 1, "r2")],
    );
    let Ok(Value::Array(replies)) = reply else {
        panic!("{reply:?}")
    };
    assert!(
        replies[..2].iter().all(|r| norm_reply(r)[0] == "-6"),
        "{replies:?}"
    );
    assert_eq!(dump(&mut conn, "S", 1).0, before, "nothing written");
}
