//! The second-chance line against a reference model, on the real scripts (`lua/line.lua`,
//! `lua/reserve.lua`) and a real redis-server: generated sequences of joins, polls, moves on,
//! purchases (alone, or several sent at once and judged in one batch in an order the model
//! cannot know), admin releases (units coming back) and holds running out. After every step
//! Redis and the model agree exactly: the stock, the line's order, who holds a unit, the units
//! sold through the line; a unit goes back on sale to a buyer only while nobody waits in the
//! line or when it is held for that buyer; nobody passes the limit; `reconcile` is clean.
//!
//! `PROPTEST_CASES` sets the number of sequences.

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, Settings};
use flashgate::reservation::Reservation;
use flashgate::stock::prelude::*;
use flashgate::stock::{
    segments, Layout, LineAnswer, LineAsk, ReleaseMode, ReleaseOutcome, ReleaseReason, ReserveCall,
    ReserveOutcome, SaleHours, StockStore,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;

const USERS: usize = 4;
const STOCK: u64 = 2;

#[derive(Clone, Debug)]
enum Op {
    Join(usize),
    Poll(usize),
    Advance,
    /// One purchase of one unit, judged alone.
    Buy(usize),
    /// Purchases sent at once (one batched call, or several).
    Burst(Vec<usize>),
    /// An admin releases a reservation: its unit comes back.
    Release(usize),
    /// The unit held for a buyer runs out (its window passed).
    Lapse(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..USERS).prop_map(Op::Join),
        2 => (0..USERS).prop_map(Op::Poll),
        2 => Just(Op::Advance),
        5 => (0..USERS).prop_map(Op::Buy),
        2 => proptest::collection::vec(0..USERS, 2..5).prop_map(Op::Burst),
        3 => any::<usize>().prop_map(Op::Release),
        2 => (0..USERS).prop_map(Op::Lapse),
    ]
}

#[derive(Default, Debug)]
struct Model {
    left: u64,
    /// Reservations still held: (id, user).
    held: Vec<(String, usize)>,
    line: Vec<usize>,
    /// Buyers a unit is held for; `false`: their hold ran out (not yet moved on).
    holds: BTreeMap<usize, bool>,
    line_sold: u64,
}

impl Model {
    fn units(&self, user: usize) -> usize {
        self.held.iter().filter(|(_, u)| *u == user).count()
    }

    /// `lua/line.lua`'s move on: the first min(left, waiting) buyers hold a unit; a hold that ran
    /// out leaves the line, and the next one takes its place.
    fn advance(&mut self) {
        loop {
            let n = (self.left as usize).min(self.line.len());
            if n == 0 {
                return;
            }
            let heads: Vec<usize> = self.line[..n].to_vec();
            let mut lapsed = Vec::new();
            for h in heads {
                match self.holds.get(&h) {
                    None => {
                        self.holds.insert(h, true);
                    }
                    Some(false) => lapsed.push(h),
                    Some(true) => {}
                }
            }
            if lapsed.is_empty() {
                return;
            }
            self.line.retain(|u| !lapsed.contains(u));
            for u in lapsed {
                self.holds.remove(&u);
            }
        }
    }

    /// Whether the line lets `user` buy now, and whether as a holder.
    fn lets(&self, user: usize) -> (bool, bool) {
        if self.line.is_empty() {
            return (true, false);
        }
        (self.holds.get(&user) == Some(&true), true)
    }
}

struct Run {
    redis: RedisServer,
    store: StockStore,
    settings: Settings,
    sale: Arc<Activity>,
    model: Model,
}

fn yaml(redis: &RedisServer) -> String {
    format!(
        r#"server: {{ listen: "127.0.0.1:1" }}
admin: {{ listen: "127.0.0.1:2" }}
upstream: {{ addresses: ["127.0.0.1:3"] }}
redis: {{ url: "{}", timeout_ms: 5000 }}
identity: {{ header: X-User-Id }}
signing: {{ header: X-Flashgate-Reservation, algorithm: HS256, key_id: k, secret_env: SECRET, ttl_secs: 900 }}
sale_routes:
  - {{ method: POST, path: "/buy/{{activity}}" }}
activities:
  - {{ id: drop, stock: {STOCK}, version: 1, per_user_limit: 1, max_per_request: 1, confirm: explicit, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", hold_secs: 900, second_chance: {{ window_secs: 3600 }} }}
"#,
        redis.url(),
    )
}

impl Run {
    async fn start() -> Run {
        let redis = RedisServer::start();
        let secrets = |name: &str| (name == "SECRET").then(|| "model-secret".to_owned());
        let settings =
            Settings::from_yaml(&yaml(&redis), std::path::Path::new("."), &secrets).unwrap();
        let store = stock_store(redis.url(), vec![], Duration::from_secs(5));
        let sale = settings.activities.get("drop").unwrap().clone();
        segments::prewarm(&store, &sale).await.unwrap().unwrap();
        Run {
            redis,
            store,
            settings,
            sale,
            model: Model {
                left: STOCK,
                ..Model::default()
            },
        }
    }

    async fn reserve(&self, user: usize) -> (String, ReserveOutcome) {
        let id = Reservation::id_in_segment(&self.sale, 0);
        let name = format!("u{user}");
        let call = ReserveCall {
            user: &name,
            qty: 1,
            per_user_limit: 1,
            version: 1,
            reservation_id: &id,
            hold: Duration::from_secs(900),
            idempotency_key: None,
            deposit: None,
            in_flight: Duration::ZERO,
            replay_only: false,
            hours: SaleHours::of(&self.sale),
            steps: None,
            line: true,
        };
        let layout = Layout::of(&self.sale);
        let outcome = self
            .store
            .reserve(layout.segment(0).unwrap(), &call)
            .await
            .unwrap();
        (id, outcome)
    }

    /// Takes a purchase's answer; `alone`: judged alone, so exactly what the model expects.
    fn bought(&mut self, user: usize, id: String, outcome: ReserveOutcome, alone: bool) {
        let (lets, holder) = self.model.lets(user);
        let m = &self.model;
        let expect = if !lets {
            ReserveOutcome::HeldForLine { remaining: m.left }
        } else if m.units(user) >= 1 {
            ReserveOutcome::LimitExceeded { held: 1 }
        } else if m.left == 0 {
            ReserveOutcome::Insufficient { remaining: 0 }
        } else {
            ReserveOutcome::Reserved {
                remaining: m.left - 1,
                created_ms: 0,
                deadline_ms: 0,
                fence: 0,
            }
        };
        let reserved = matches!(outcome, ReserveOutcome::Reserved { .. });
        if alone {
            let same = match (&outcome, &expect) {
                (
                    ReserveOutcome::Reserved { remaining: a, .. },
                    ReserveOutcome::Reserved { remaining: b, .. },
                ) => a == b,
                (a, b) => a == b,
            };
            assert!(
                same,
                "u{user}: {outcome:?}, expected {expect:?}\n{:?}",
                self.model
            );
        }
        if reserved {
            assert!(
                lets,
                "u{user} bought while the line waits and holds nothing for them: {:?}",
                self.model
            );
            assert!(
                self.model.left >= 1 && self.model.units(user) == 0,
                "{:?}",
                self.model
            );
            self.model.left -= 1;
            self.model.held.push((id, user));
            if holder {
                self.model.line.retain(|u| *u != user);
                self.model.holds.remove(&user);
                self.model.line_sold += 1;
            }
        }
    }

    async fn line(&mut self, ask: LineAsk, user: Option<usize>) {
        let name = user.map(|u| format!("u{u}")).unwrap_or_default();
        let view = self.store.line(&self.sale, ask, &name).await.unwrap();
        let m = &mut self.model;
        m.advance();
        let want = match (ask, user) {
            (LineAsk::Join, Some(u)) => {
                if m.line.contains(&u) {
                    LineAnswer::Joined
                } else if m.line.is_empty() && m.left > 0 {
                    LineAnswer::NotSoldOut
                } else if m.units(u) >= 1 {
                    LineAnswer::AtLimit
                } else {
                    m.line.push(u);
                    m.advance();
                    LineAnswer::Joined
                }
            }
            (LineAsk::Poll, Some(u)) if !m.line.contains(&u) => LineAnswer::NotInLine,
            (LineAsk::Poll, _) => LineAnswer::Polled,
            _ => LineAnswer::Advanced,
        };
        assert_eq!(view.answer, want, "{ask:?} u{user:?}: {view:?}\n{m:?}");
        if let Some(u) = user {
            let place = m
                .line
                .iter()
                .position(|x| *x == u)
                .map_or(0, |p| p as u64 + 1);
            assert_eq!(view.place, place, "u{u}'s place: {view:?}\n{m:?}");
            assert_eq!(
                view.hold_left_ms > 0,
                m.holds.get(&u) == Some(&true),
                "{view:?}\n{m:?}"
            );
        }
        assert_eq!(view.waiting, m.line.len() as u64);
    }

    async fn apply(&mut self, op: &Op) {
        match op {
            Op::Join(u) => self.line(LineAsk::Join, Some(*u)).await,
            Op::Poll(u) => self.line(LineAsk::Poll, Some(*u)).await,
            Op::Advance => self.line(LineAsk::Advance, None).await,
            Op::Buy(u) => {
                let (id, outcome) = self.reserve(*u).await;
                self.bought(*u, id, outcome, true);
            }
            Op::Burst(users) => {
                let answers =
                    futures_util::future::join_all(users.iter().map(|u| self.reserve(*u))).await;
                // Taken in the order the store judged them: those that bought first (each a
                // holder, or bought while nobody waited), then the refusals.
                let (made, rest): (Vec<_>, Vec<_>) = users
                    .iter()
                    .zip(answers)
                    .partition(|(_, (_, o))| matches!(o, ReserveOutcome::Reserved { .. }));
                for (u, (id, outcome)) in made.into_iter().chain(rest) {
                    self.bought(*u, id, outcome, false);
                }
            }
            Op::Release(pick) => {
                if self.model.held.is_empty() {
                    return;
                }
                let (id, _) = self.model.held.remove(pick % self.model.held.len());
                let layout = Layout::of(&self.sale);
                let got = self
                    .store
                    .release(
                        layout.segment(0).unwrap(),
                        1,
                        &id,
                        ReleaseMode::Admin,
                        ReleaseReason::Admin,
                    )
                    .await
                    .unwrap();
                assert!(matches!(got, ReleaseOutcome::Released { .. }), "{got:?}");
                self.model.left += 1;
            }
            Op::Lapse(u) => {
                if self.model.holds.get(u) == Some(&true) {
                    let _: () = redis::cmd("HSET")
                        .arg("fg:{drop}:line:holds")
                        .arg(format!("u{u}"))
                        .arg(1)
                        .query(&mut self.redis.conn())
                        .unwrap();
                    self.model.holds.insert(*u, false);
                }
            }
        }
    }

    /// Redis and the model agree: stock, the line's order, its holds, units sold through it;
    /// reconcile clean.
    async fn check(&self) {
        let mut conn = self.redis.conn();
        let left: i64 = redis::cmd("GET")
            .arg("fg:{drop}:v1:stock")
            .query(&mut conn)
            .unwrap();
        assert_eq!(left as u64, self.model.left, "{:?}", self.model);
        let line: Vec<String> = redis::cmd("ZRANGE")
            .arg("fg:{drop}:line")
            .arg(0)
            .arg(-1)
            .query(&mut conn)
            .unwrap();
        let want: Vec<String> = self.model.line.iter().map(|u| format!("u{u}")).collect();
        assert_eq!(line, want, "{:?}", self.model);
        let mut holds: Vec<String> = redis::cmd("HKEYS")
            .arg("fg:{drop}:line:holds")
            .query(&mut conn)
            .unwrap();
        holds.sort();
        let want: Vec<String> = self.model.holds.keys().map(|u| format!("u{u}")).collect();
        assert_eq!(holds, want, "{:?}", self.model);
        let sold: Option<u64> = redis::cmd("HGET")
            .arg("fg:{drop}:v1:ledger")
            .arg("line_sold")
            .query(&mut conn)
            .unwrap();
        assert_eq!(sold.unwrap_or(0), self.model.line_sold);
        let report = flashgate::reconcile::reconcile(&self.settings, &self.store, None)
            .await
            .unwrap();
        assert!(report.clean(), "{}", report.table());
    }
}

fn play(ops: &[Op]) {
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
    })
}

proptest! {
    #![proptest_config(support::generated::sequences(24, 256))]

    #[test]
    fn the_line_keeps_every_invariant(ops in proptest::collection::vec(op(), 1..40)) {
        play(&ops);
    }
}

/// A fixed sequence: a sell-out, two join, a unit comes back for the first, a stranger and the
/// second are refused, the first buys; the next unit's holder lets it run out, and it passes
/// to the one after.
#[test]
fn returned_units_go_to_the_line_in_order() {
    play(&[
        Op::Buy(0),
        Op::Buy(1),
        Op::Join(2),
        Op::Join(3),
        Op::Join(0),
        Op::Release(0),
        Op::Advance,
        Op::Buy(3),
        Op::Buy(2),
        Op::Release(0),
        Op::Advance,
        Op::Lapse(3),
        Op::Poll(3),
        Op::Advance,
        Op::Buy(1),
    ]);
}
