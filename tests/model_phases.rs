//! A sale in phases against a reference model, on the real reserve script and a real
//! redis-server: generated sequences of purchases (alone, or several sent at once and judged
//! in one batch, in an order the model cannot know), each made with one of four buyers' steps
//! (a member whose phase with a limit of 1 is open, a listed fan whose phase with the
//! activity's limit is open, a buyer in no phase before the public start, a buyer after it),
//! keyed retries, confirms, owner and admin releases, and holds running out. After every step
//! Redis and the model agree exactly: the stock, each buyer's units (one limit over every
//! phase), each record's state, each phase's units taken (`sold@<phase>`); a buyer whose steps
//! have not started never buys; and `reconcile` is clean.
//!
//! `PROPTEST_CASES` sets the number of sequences.

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, Settings};
use flashgate::reservation::Reservation;
use flashgate::stock::prelude::*;
use flashgate::stock::{
    segments, ConfirmOutcome, ConfirmedVia, Layout, ReleaseMode, ReleaseOutcome, ReleaseReason,
    ReserveCall, ReserveOutcome, SaleHours, Steps, StockStore,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;

const USERS: usize = 3;
/// The activity's limit; the members' phase allows 1.
const LIMIT: u64 = 2;
const STOCK: u64 = 5;
/// A hold that runs out at once (the sweep releases it), or one that outlasts the sequence.
const SHORT: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(900);

/// The steps a purchase is made with (the gateway's phase gate decides them per request: a
/// list dropped or a claim changed between two requests changes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    /// The members' phase (limit 1) is open; the public sale is an hour away.
    Member,
    /// The fans' phase (the activity's limit) is open; the public sale an hour away.
    Fan,
    /// In no phase; the public sale an hour away.
    Nobody,
    /// The public sale opened an hour ago (after a members' phase).
    Public,
}

impl Profile {
    /// The limit and phase in force now, `None` before the first step.
    fn now(self) -> Option<(u64, &'static str)> {
        match self {
            Profile::Member => Some((1, "members")),
            Profile::Fan => Some((LIMIT, "fans")),
            Profile::Nobody => None,
            Profile::Public => Some((LIMIT, "public")),
        }
    }

    /// Its steps around `now_ms` (Redis's clock).
    fn steps(self, now_ms: i64) -> Steps {
        let hour = 3_600_000;
        let public = (now_ms + hour, LIMIT as u32, "public");
        match self {
            Profile::Member => Steps::new([(now_ms - hour, 1, "members"), public]),
            Profile::Fan => Steps::new([(now_ms - hour, LIMIT as u32, "fans"), public]),
            Profile::Nobody => Steps::new([public]),
            Profile::Public => Steps::new([
                (now_ms - 2 * hour, 1, "members"),
                (now_ms - hour, LIMIT as u32, "public"),
            ]),
        }
    }
}

#[derive(Clone, Debug)]
struct Buy {
    user: usize,
    profile: Profile,
    qty: u32,
    key: Option<u8>,
    short: bool,
}
#[derive(Clone, Debug)]
enum Op {
    /// One purchase, judged alone.
    Reserve(Buy),
    /// Several purchases sent at once (one batched script call, or several).
    Burst(Vec<Buy>),
    Confirm {
        pick: usize,
    },
    /// The request that made the reservation gives it back (its upstream failed).
    OwnerRelease {
        pick: usize,
    },
    /// The backend or an operator cancels.
    AdminRelease {
        pick: usize,
    },
    /// Every hold that ran out is released (the sweep of both variants).
    Sweep,
}

fn buy() -> impl Strategy<Value = Buy> {
    let profile = prop_oneof![
        Just(Profile::Member),
        Just(Profile::Fan),
        Just(Profile::Nobody),
        Just(Profile::Public),
    ];
    (
        0..USERS,
        profile,
        prop_oneof![3 => Just(1u32), 1 => Just(2)],
        proptest::option::weighted(0.5, 0..2u8),
        proptest::bool::weighted(0.3),
    )
        .prop_map(|(user, profile, qty, key, short)| Buy {
            user,
            profile,
            qty,
            key,
            short,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => buy().prop_map(Op::Reserve),
        3 => proptest::collection::vec(buy(), 2..6).prop_map(Op::Burst),
        3 => any::<usize>().prop_map(|pick| Op::Confirm { pick }),
        2 => any::<usize>().prop_map(|pick| Op::OwnerRelease { pick }),
        2 => any::<usize>().prop_map(|pick| Op::AdminRelease { pick }),
        2 => Just(Op::Sweep),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Pending,
    Confirmed,
    Released,
}

#[derive(Clone, Debug)]
struct Rec {
    id: String,
    user: usize,
    qty: u64,
    state: St,
    short: bool,
    /// A keyed replay handed it to another request: its maker may no longer release it.
    replayed: bool,
}

#[derive(Default, Debug)]
struct Model {
    left: u64,
    recs: Vec<Rec>,
    /// (user, key) -> the reservation (index) the key won last.
    keys: BTreeMap<(usize, u8), usize>,
    /// Units taken in each phase (gross: a unit given back stays counted where it was taken).
    sold: BTreeMap<&'static str, u64>,
}

impl Model {
    fn new() -> Model {
        Model {
            left: STOCK,
            ..Model::default()
        }
    }

    fn held(&self, user: usize) -> u64 {
        self.recs
            .iter()
            .filter(|r| r.user == user && r.state != St::Released)
            .map(|r| r.qty)
            .sum()
    }

    /// What a purchase judged alone must get.
    fn expect(&self, b: &Buy) -> Expect {
        if let Some(&i) = b.key.and_then(|k| self.keys.get(&(b.user, k))) {
            let r = &self.recs[i];
            if r.state == St::Pending && r.short {
                // Its hold ran out: being settled, never handed out again.
                return Expect::HoldRanOut;
            }
            if r.state != St::Released {
                return if r.qty == u64::from(b.qty) {
                    Expect::Replayed(i)
                } else {
                    Expect::OtherQty
                };
            }
        }
        let Some((limit, _)) = b.profile.now() else {
            return Expect::NotStarted;
        };
        if self.held(b.user) + u64::from(b.qty) > limit {
            Expect::Limit
        } else if self.left < u64::from(b.qty) {
            Expect::SoldOut
        } else {
            Expect::Reserved
        }
    }

    fn give_back(&mut self, i: usize) {
        let r = &mut self.recs[i];
        r.state = St::Released;
        self.left += r.qty;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Reserved,
    Replayed(usize),
    Limit,
    SoldOut,
    NotStarted,
    OtherQty,
    HoldRanOut,
}

struct Run {
    _redis: RedisServer,
    store: StockStore,
    settings: Settings,
    sale: Arc<Activity>,
    /// Redis's clock when the run started (unix ms): the steps are an hour either side.
    now_ms: i64,
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
  - {{ id: drop, stock: {STOCK}, version: 1, per_user_limit: {LIMIT}, max_per_request: 2, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", hold_secs: 900, phases: [{{ id: members, starts_at: "2019-01-01T00:00:00Z", who: {{ list: members }}, per_user_limit: 1 }}, {{ id: fans, starts_at: "2019-06-01T00:00:00Z", who: {{ list: fans }} }}] }}
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
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut redis.conn()).unwrap();
        Run {
            _redis: redis,
            store,
            settings,
            sale,
            now_ms: secs * 1000 + micros / 1000,
            model: Model::new(),
        }
    }

    /// A purchase's reserve, as the gateway sends it (a fresh id, the buyer's steps).
    async fn reserve(&self, b: &Buy) -> (String, ReserveOutcome) {
        let lane = &self.sale;
        let steps = b.profile.steps(self.now_ms);
        let id = Reservation::id_in_segment(lane, 0);
        let user = format!("u{}", b.user);
        let key = b.key.map(|k| format!("k{k}"));
        let call = ReserveCall {
            user: &user,
            qty: b.qty,
            per_user_limit: lane.per_user_limit.get(),
            version: lane.version,
            reservation_id: &id,
            hold: if b.short { SHORT } else { LONG },
            idempotency_key: key.as_deref(),
            deposit: None,
            in_flight: Duration::ZERO,
            replay_only: false,
            hours: SaleHours::of(lane),
            steps: Some(&steps),
            line: false,
        };
        let layout = Layout::of(lane);
        let outcome = self
            .store
            .reserve(layout.segment(0).unwrap(), &call)
            .await
            .unwrap();
        (id, outcome)
    }

    /// Takes a reserve's answer into the model; `alone`: it was judged alone, so it must be
    /// exactly what the model expects.
    fn answered(&mut self, b: &Buy, id: String, outcome: ReserveOutcome, alone: bool) {
        let expect = self.model.expect(b);
        let got = match &outcome {
            ReserveOutcome::Reserved { .. } => Expect::Reserved,
            ReserveOutcome::Replayed { id: old, .. } => {
                let i = self.model.recs.iter().position(|r| r.id == *old);
                Expect::Replayed(i.unwrap_or_else(|| panic!("replayed unknown {old}")))
            }
            ReserveOutcome::LimitExceeded { .. } => Expect::Limit,
            ReserveOutcome::Insufficient { .. } => Expect::SoldOut,
            ReserveOutcome::NotStarted => Expect::NotStarted,
            ReserveOutcome::ReplayQuantityDiffers { .. } => Expect::OtherQty,
            ReserveOutcome::HoldRanOut => Expect::HoldRanOut,
            other => panic!("{b:?}: unexpected {other:?}"),
        };
        if alone {
            assert_eq!(got, expect, "{b:?}: {outcome:?}\n{:?}", self.model);
        }
        match got {
            Expect::Reserved => {
                let (limit, phase) = b
                    .profile
                    .now()
                    .unwrap_or_else(|| panic!("{b:?} bought before its first step"));
                assert!(
                    self.model.held(b.user) + u64::from(b.qty) <= limit,
                    "u{} past the limit of its phase {phase}: {:?}",
                    b.user,
                    self.model
                );
                assert!(self.model.left >= u64::from(b.qty), "past the stock");
                self.model.left -= u64::from(b.qty);
                *self.model.sold.entry(phase).or_insert(0) += u64::from(b.qty);
                self.model.recs.push(Rec {
                    id,
                    user: b.user,
                    qty: u64::from(b.qty),
                    state: St::Pending,
                    short: b.short,
                    replayed: false,
                });
                if let Some(k) = b.key {
                    self.model
                        .keys
                        .insert((b.user, k), self.model.recs.len() - 1);
                }
            }
            Expect::Replayed(i) => {
                assert_eq!(
                    Some(&i),
                    b.key.and_then(|k| self.model.keys.get(&(b.user, k))),
                    "a replay returns the key's reservation"
                );
                self.model.recs[i].replayed = true;
            }
            Expect::NotStarted => assert_eq!(b.profile, Profile::Nobody, "{b:?}"),
            Expect::Limit | Expect::SoldOut | Expect::OtherQty | Expect::HoldRanOut => {}
        }
    }

    fn pick(&self, pick: usize) -> Option<usize> {
        (!self.model.recs.is_empty()).then(|| pick % self.model.recs.len())
    }

    async fn apply(&mut self, op: &Op) {
        match op {
            Op::Reserve(b) => {
                let (id, outcome) = self.reserve(b).await;
                self.answered(b, id, outcome, true);
            }
            Op::Burst(buys) => {
                let answers =
                    futures_util::future::join_all(buys.iter().map(|b| self.reserve(b))).await;
                // Redis judged them in an order of its own: the reservations made first, so a
                // replay of one made in the same batch finds it.
                let (made, rest): (Vec<_>, Vec<_>) = buys
                    .iter()
                    .zip(answers)
                    .partition(|(_, (_, o))| matches!(o, ReserveOutcome::Reserved { .. }));
                for (b, (id, outcome)) in made.into_iter().chain(rest) {
                    self.answered(b, id, outcome, false);
                }
            }
            Op::Confirm { pick } => {
                let Some(i) = self.pick(*pick) else { return };
                let r = self.model.recs[i].clone();
                let lane = Layout::of(&self.sale);
                let got = self
                    .store
                    .confirm(lane.segment(0).unwrap(), 1, &[&r.id], ConfirmedVia::Admin)
                    .await
                    .unwrap();
                let want = match r.state {
                    St::Pending => ConfirmOutcome::Confirmed,
                    St::Confirmed => ConfirmOutcome::AlreadyConfirmed,
                    // An admin confirm of a released reservation is a conflict, never a sale.
                    St::Released => ConfirmOutcome::Released,
                };
                assert_eq!(got, vec![want], "{r:?}");
                if r.state == St::Pending {
                    self.model.recs[i].state = St::Confirmed;
                }
            }
            Op::OwnerRelease { pick } | Op::AdminRelease { pick } => {
                let Some(i) = self.pick(*pick) else { return };
                let admin = matches!(op, Op::AdminRelease { .. });
                let r = self.model.recs[i].clone();
                let lane = Layout::of(&self.sale);
                let (mode, reason) = match admin {
                    true => (ReleaseMode::Admin, ReleaseReason::Admin),
                    false => (ReleaseMode::Owner, ReleaseReason::Upstream5xx),
                };
                let got = self
                    .store
                    .release(lane.segment(0).unwrap(), 1, &r.id, mode, reason)
                    .await
                    .unwrap();
                let gives_back = match (r.state, admin) {
                    (St::Released, _) => false,
                    (St::Confirmed, false) => false,
                    (St::Pending, false) => !r.replayed,
                    (_, true) => true,
                };
                assert_eq!(
                    matches!(got, ReleaseOutcome::Released { .. }),
                    gives_back,
                    "{r:?} admin={admin}: {got:?}"
                );
                if gives_back {
                    self.model.give_back(i);
                }
            }
            Op::Sweep => {
                let layout = Layout::of(&self.sale);
                self.store
                    .sweep(layout.segment(0).unwrap(), 1, 100, None)
                    .await
                    .unwrap();
                let due: Vec<usize> = (0..self.model.recs.len())
                    .filter(|&i| {
                        let r = &self.model.recs[i];
                        r.short && r.state == St::Pending
                    })
                    .collect();
                for i in due {
                    self.model.give_back(i);
                }
            }
        }
    }

    /// Redis and the model agree: the stock, each buyer's units, each record's state, each
    /// phase's units; reconcile clean.
    async fn check(&self) {
        let layout = Layout::of(&self.sale);
        let one = layout.segment(0).unwrap();
        let row = self.store.ledger(one, 1).await.unwrap();
        assert_eq!(row.remaining as u64, self.model.left, "{row:?}");
        for r in &self.model.recs {
            let rec = (self.store.lookup(one, &r.id).await.unwrap())
                .unwrap_or_else(|| panic!("no record of {}", r.id));
            let state = format!("{:?}", rec.state).to_lowercase();
            let want = format!("{:?}", r.state).to_lowercase();
            assert_eq!(state, want, "{r:?}");
        }
        for u in 0..USERS {
            let held = self.store.units_held(one, &format!("u{u}")).await.unwrap();
            assert_eq!(held, self.model.held(u), "u{u}'s units over every phase");
            assert!(held <= LIMIT);
        }
        let phases = ["members", "fans", "public"];
        let sold = self.store.phase_sold(&self.sale, &phases).await.unwrap();
        for (phase, units) in phases.iter().zip(sold) {
            let want = self.model.sold.get(phase).copied().unwrap_or(0);
            assert_eq!(units, want, "units taken in phase {phase}");
        }
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
    fn a_sale_in_phases_keeps_every_invariant(ops in proptest::collection::vec(op(), 1..40)) {
        play(&ops);
    }
}

/// A fixed sequence: a member takes their phase's one unit and is refused a second, a buyer in
/// no phase is refused before the public start (even with a key), the member's key replays the
/// same reservation whatever steps it comes with, and after the public start they reach the
/// activity's limit over both phases.
#[test]
fn a_members_limit_then_the_public_one_over_both() {
    let b = |user, profile, qty, key| Buy {
        user,
        profile,
        qty,
        key,
        short: false,
    };
    play(&[
        Op::Reserve(b(0, Profile::Member, 1, Some(0))),
        Op::Reserve(b(0, Profile::Member, 1, None)),
        Op::Reserve(b(1, Profile::Nobody, 1, Some(1))),
        Op::Reserve(b(0, Profile::Nobody, 1, Some(0))),
        Op::Reserve(b(0, Profile::Public, 1, None)),
        Op::Reserve(b(0, Profile::Public, 1, None)),
        Op::Burst(vec![
            b(1, Profile::Fan, 2, None),
            b(2, Profile::Member, 1, None),
            b(2, Profile::Public, 2, None),
        ]),
        Op::AdminRelease { pick: 0 },
        Op::Reserve(b(0, Profile::Member, 1, None)),
    ]);
}
