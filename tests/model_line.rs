//! The second-chance line against a reference model, on the real scripts (`lua/line.lua`,
//! `lua/reserve.lua`) and a real redis-server: generated sequences of joins, polls, moves on,
//! purchases (alone, or several sent at once and judged in one batch in an order the model
//! cannot know), admin releases (units coming back) and holds running out, and a purchase sent
//! while a join, a move on or a release runs (either may reach Redis first: the model accepts
//! the order whose answers both match, never one step for two). After every step
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
    /// A purchase in flight (sent, not yet answered) while another step runs: a `Join`,
    /// `Advance` or `Release`.
    Race(usize, Box<Op>),
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
        3 => (0..USERS, prop_oneof![
            (0..USERS).prop_map(Op::Join),
            Just(Op::Advance),
            any::<usize>().prop_map(Op::Release),
        ])
            .prop_map(|(u, other)| Op::Race(u, Box::new(other))),
    ]
}

#[derive(Default, Debug, Clone)]
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

    /// Takes a purchase's answer into the model; `alone`: judged alone, so exactly what the
    /// model expects. Err: what does not match.
    fn take(
        &mut self,
        user: usize,
        id: String,
        outcome: ReserveOutcome,
        alone: bool,
    ) -> Result<(), String> {
        let (lets, holder) = self.lets(user);
        let expect = if !lets {
            ReserveOutcome::HeldForLine {
                remaining: self.left,
            }
        } else if self.units(user) >= 1 {
            ReserveOutcome::LimitExceeded { held: 1 }
        } else if self.left == 0 {
            ReserveOutcome::Insufficient { remaining: 0 }
        } else {
            ReserveOutcome::Reserved {
                remaining: self.left - 1,
                created_ms: 0,
                deadline_ms: 0,
                fence: 0,
            }
        };
        let reserved = matches!(outcome, ReserveOutcome::Reserved { .. });
        let same = match (&outcome, &expect) {
            (
                ReserveOutcome::Reserved { remaining: a, .. },
                ReserveOutcome::Reserved { remaining: b, .. },
            ) => a == b,
            (a, b) => a == b,
        };
        if alone && !same {
            return Err(format!(
                "u{user}: {outcome:?}, expected {expect:?}\n{self:?}"
            ));
        }
        if reserved {
            if !lets {
                return Err(format!(
                    "u{user} bought while the line waits and holds nothing for them: {self:?}"
                ));
            }
            if self.left < 1 || self.units(user) != 0 {
                return Err(format!("u{user} bought past the stock or limit: {self:?}"));
            }
            self.left -= 1;
            self.held.push((id, user));
            if holder {
                self.line.retain(|u| *u != user);
                self.holds.remove(&user);
                self.line_sold += 1;
            }
        }
        Ok(())
    }

    /// Takes a line call's answer into the model. Err: what does not match.
    fn answer(
        &mut self,
        ask: LineAsk,
        user: Option<usize>,
        view: &flashgate::stock::LineView,
    ) -> Result<(), String> {
        self.advance();
        let want = match (ask, user) {
            (LineAsk::Join, Some(u)) => {
                if self.line.contains(&u) {
                    LineAnswer::Joined
                } else if self.line.is_empty() && self.left > 0 {
                    LineAnswer::NotSoldOut
                } else if self.units(u) >= 1 {
                    LineAnswer::AtLimit
                } else {
                    self.line.push(u);
                    self.advance();
                    LineAnswer::Joined
                }
            }
            (LineAsk::Poll, Some(u)) if !self.line.contains(&u) => LineAnswer::NotInLine,
            (LineAsk::Poll, _) => LineAnswer::Polled,
            _ => LineAnswer::Advanced,
        };
        if view.answer != want {
            return Err(format!(
                "{ask:?} u{user:?}: {view:?}, expected {want:?}\n{self:?}"
            ));
        }
        if let Some(u) = user {
            let place = self
                .line
                .iter()
                .position(|x| *x == u)
                .map_or(0, |p| p as u64 + 1);
            if view.place != place || (view.hold_left_ms > 0) != (self.holds.get(&u) == Some(&true))
            {
                return Err(format!("u{u}'s place or hold: {view:?}\n{self:?}"));
            }
        }
        if view.waiting != self.line.len() as u64 {
            return Err(format!("waiting: {view:?}\n{self:?}"));
        }
        Ok(())
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
        if let Err(e) = self.model.take(user, id, outcome, alone) {
            panic!("{e}");
        }
    }

    async fn line(&mut self, ask: LineAsk, user: Option<usize>) {
        let view = self.line_call(ask, user).await;
        if let Err(e) = self.model.answer(ask, user, &view) {
            panic!("{e}");
        }
    }

    async fn line_call(&self, ask: LineAsk, user: Option<usize>) -> flashgate::stock::LineView {
        let name = user.map(|u| format!("u{u}")).unwrap_or_default();
        self.store.line(&self.sale, ask, &name).await.unwrap()
    }

    /// An admin release of the reservation `pick` names (taken out of the model's holdings);
    /// None when nobody holds one.
    fn pick_release(&mut self, pick: usize) -> Option<String> {
        if self.model.held.is_empty() {
            return None;
        }
        Some(self.model.held.remove(pick % self.model.held.len()).0)
    }

    async fn release_call(&self, id: &str) {
        let layout = Layout::of(&self.sale);
        let got = self
            .store
            .release(
                layout.segment(0).unwrap(),
                1,
                id,
                ReleaseMode::Admin,
                ReleaseReason::Admin,
            )
            .await
            .unwrap();
        assert!(matches!(got, ReleaseOutcome::Released { .. }), "{got:?}");
    }

    /// A purchase sent while `other` runs: Redis ran one first, whichever; the model takes the
    /// order in which both answers are what it expects (both, when they agree).
    async fn race(&mut self, user: usize, other: &Op) {
        // The reservation released, still held in the model until the release's turn.
        let released = match other {
            Op::Release(pick) if !self.model.held.is_empty() => Some(Some(
                self.model.held[pick % self.model.held.len()].0.clone(),
            )),
            Op::Release(_) => Some(None),
            _ => None,
        };
        let (ask, asker) = match other {
            Op::Join(v) => (Some(LineAsk::Join), Some(*v)),
            Op::Advance => (Some(LineAsk::Advance), None),
            _ => (None, None),
        };
        let other_call = async {
            match (&released, ask) {
                (Some(Some(id)), _) => {
                    self.release_call(id).await;
                    None
                }
                (None, Some(ask)) => Some(self.line_call(ask, asker).await),
                _ => None,
            }
        };
        let ((id, outcome), view) = tokio::join!(self.reserve(user), other_call);
        let other_step = |m: &mut Model| -> Result<(), String> {
            match (&released, ask, &view) {
                (Some(Some(id)), _, _) => {
                    m.held.retain(|(held, _)| held != id);
                    m.left += 1;
                    Ok(())
                }
                (None, Some(ask), Some(view)) => m.answer(ask, asker, view),
                _ => Ok(()),
            }
        };
        let mut buy_first = self.model.clone();
        let first = buy_first
            .take(user, id.clone(), outcome.clone(), true)
            .and_then(|()| other_step(&mut buy_first));
        let mut other_first = self.model.clone();
        let second =
            other_step(&mut other_first).and_then(|()| other_first.take(user, id, outcome, true));
        self.model = match (first, second) {
            (Ok(()), _) => buy_first,
            (_, Ok(())) => other_first,
            (Err(a), Err(b)) => panic!("no order explains u{user} racing {other:?}:\n{a}\n{b}"),
        };
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
                if let Some(id) = self.pick_release(*pick) {
                    self.release_call(&id).await;
                    self.model.left += 1;
                }
            }
            Op::Race(u, other) => self.race(*u, other).await,
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

/// Purchases in flight while a unit comes back and the line moves on: whichever reaches Redis
/// first, the unit goes to the line's head, never to the racing stranger.
#[test]
fn a_purchase_in_flight_during_a_release_or_a_move_on() {
    play(&[
        Op::Buy(0),
        Op::Buy(1),
        Op::Join(2),
        Op::Race(3, Box::new(Op::Release(0))),
        Op::Race(3, Box::new(Op::Advance)),
        Op::Race(2, Box::new(Op::Join(3))),
        Op::Race(0, Box::new(Op::Release(1))),
        Op::Advance,
        Op::Buy(3),
    ]);
}
