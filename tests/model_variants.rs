//! The variants of a drop against a reference model, on the real scripts and a real
//! redis-server (issue 34): generated sequences of purchases (alone, or several sent at once
//! and judged in one batch), keyed retries naming the same or another variant, confirms, owner
//! and admin releases, and holds running out, over a drop of two variants that share one
//! per-buyer limit. After every step the model and Redis must agree exactly: each variant's
//! stock, each buyer's units across the variants, each reservation's state; and `reconcile` is
//! clean. A purchase sent with others is judged by Redis in an order the model cannot know, so
//! the model takes the batch's answers as they came and checks them against what any order
//! allows (no variant past its stock, no buyer past the limit, a key's replay the same
//! reservation).
//!
//! `PROPTEST_CASES` sets the number of sequences.

#[path = "support/mod.rs"]
mod support;

use flashgate::config::{Activity, Settings};
use flashgate::reservation::Reservation;
use flashgate::stock::prelude::*;
use flashgate::stock::{
    segments, ConfirmOutcome, ConfirmedVia, Layout, ReleaseMode, ReleaseOutcome, ReleaseReason,
    ReserveCall, ReserveOutcome, SaleHours, StockStore,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;

const USERS: usize = 3;
const LIMIT: u64 = 2;
const VARIANTS: [(&str, u64); 2] = [("a", 3), ("b", 4)];
/// A hold that runs out at once (the sweep releases it), or one that outlasts the sequence.
const SHORT: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(900);

#[derive(Clone, Debug)]
struct Buy {
    user: usize,
    variant: usize,
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
    (
        0..USERS,
        0..VARIANTS.len(),
        prop_oneof![3 => Just(1u32), 1 => Just(2)],
        proptest::option::weighted(0.5, 0..2u8),
        proptest::bool::weighted(0.3),
    )
        .prop_map(|(user, variant, qty, key, short)| Buy {
            user,
            variant,
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
    variant: usize,
    qty: u64,
    state: St,
    short: bool,
    /// A keyed replay handed it to another request: its maker may no longer release it.
    replayed: bool,
}

#[derive(Default, Debug)]
struct Model {
    left: [u64; 2],
    recs: Vec<Rec>,
    /// (user, key) -> the reservation (index) the key won last.
    keys: BTreeMap<(usize, u8), usize>,
}

impl Model {
    fn new() -> Model {
        Model {
            left: [VARIANTS[0].1, VARIANTS[1].1],
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
            if r.variant != b.variant {
                return Expect::OtherVariant;
            }
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
        if self.held(b.user) + u64::from(b.qty) > LIMIT {
            Expect::Limit
        } else if self.left[b.variant] < u64::from(b.qty) {
            Expect::SoldOut
        } else {
            Expect::Reserved
        }
    }

    fn give_back(&mut self, i: usize) {
        let r = &mut self.recs[i];
        r.state = St::Released;
        self.left[r.variant] += r.qty;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Reserved,
    Replayed(usize),
    Limit,
    SoldOut,
    OtherVariant,
    OtherQty,
    HoldRanOut,
}

struct Run {
    _redis: RedisServer,
    store: StockStore,
    settings: Settings,
    lanes: Vec<Arc<Activity>>,
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
  - {{ method: POST, path: "/buy/{{activity}}", variant_query: variant }}
activities:
  - {{ id: drop, version: 1, per_user_limit: {LIMIT}, max_per_request: 2, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z", hold_secs: 900, variants: [{{ id: a, stock: {} }}, {{ id: b, stock: {} }}] }}
"#,
        redis.url(),
        VARIANTS[0].1,
        VARIANTS[1].1
    )
}

impl Run {
    async fn start() -> Run {
        let redis = RedisServer::start();
        let secrets = |name: &str| (name == "SECRET").then(|| "model-secret".to_owned());
        let settings =
            Settings::from_yaml(&yaml(&redis), std::path::Path::new("."), &secrets).unwrap();
        let store = stock_store(redis.url(), vec![], Duration::from_secs(5));
        let lanes: Vec<Arc<Activity>> = settings.activities.lanes().cloned().collect();
        for lane in &lanes {
            segments::prewarm(&store, lane).await.unwrap().unwrap();
        }
        Run {
            _redis: redis,
            store,
            settings,
            lanes,
            model: Model::new(),
        }
    }

    /// A purchase's reserve, as the gateway sends it (a fresh id naming the variant's lane).
    async fn reserve(&self, b: &Buy) -> (String, ReserveOutcome) {
        let lane = &self.lanes[b.variant];
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
            steps: None,
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
            ReserveOutcome::ReplayOtherVariant => Expect::OtherVariant,
            ReserveOutcome::ReplayQuantityDiffers { .. } => Expect::OtherQty,
            ReserveOutcome::HoldRanOut => Expect::HoldRanOut,
            other => panic!("{b:?}: unexpected {other:?}"),
        };
        if alone {
            assert_eq!(got, expect, "{b:?}: {outcome:?}\n{:?}", self.model);
        }
        match got {
            Expect::Reserved => {
                assert!(
                    self.model.held(b.user) + u64::from(b.qty) <= LIMIT,
                    "u{} past the limit across variants: {:?}",
                    b.user,
                    self.model
                );
                assert!(
                    self.model.left[b.variant] >= u64::from(b.qty),
                    "variant {} past its stock",
                    VARIANTS[b.variant].0
                );
                self.model.left[b.variant] -= u64::from(b.qty);
                self.model.recs.push(Rec {
                    id,
                    user: b.user,
                    variant: b.variant,
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
                assert_eq!(self.model.recs[i].variant, b.variant);
                self.model.recs[i].replayed = true;
            }
            Expect::OtherVariant => {
                let i = b.key.and_then(|k| self.model.keys.get(&(b.user, k)));
                assert!(
                    i.is_some_and(|&i| self.model.recs[i].variant != b.variant),
                    "another variant's key: {b:?}"
                );
            }
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
                let lane = Layout::of(&self.lanes[r.variant]);
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
                let lane = Layout::of(&self.lanes[r.variant]);
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
                for lane in &self.lanes {
                    let layout = Layout::of(lane);
                    self.store
                        .sweep(layout.segment(0).unwrap(), 1, 100, None)
                        .await
                        .unwrap();
                }
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

    /// Redis and the model agree: each variant's stock, each buyer's units, each record's state;
    /// reconcile clean.
    async fn check(&self) {
        for (v, lane) in self.lanes.iter().enumerate() {
            let layout = Layout::of(lane);
            let row = self
                .store
                .ledger(layout.segment(0).unwrap(), 1)
                .await
                .unwrap();
            assert_eq!(
                row.remaining as u64, self.model.left[v],
                "variant {v}: {row:?}"
            );
            for r in self.model.recs.iter().filter(|r| r.variant == v) {
                let rec = self
                    .store
                    .lookup(layout.segment(0).unwrap(), &r.id)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("no record of {}", r.id));
                let state = format!("{:?}", rec.state).to_lowercase();
                let want = format!("{:?}", r.state).to_lowercase();
                assert_eq!(state, want, "{r:?}");
            }
        }
        let home = Layout::of(&self.lanes[0]);
        for u in 0..USERS {
            let held = self
                .store
                .units_held(home.segment(0).unwrap(), &format!("u{u}"))
                .await
                .unwrap();
            assert_eq!(held, self.model.held(u), "u{u}'s units across variants");
            assert!(held <= LIMIT);
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
    fn a_drops_variants_keep_every_invariant(ops in proptest::collection::vec(op(), 1..40)) {
        play(&ops);
    }
}

/// A fixed sequence: a key's purchase of one variant, its retry naming the other (refused),
/// the same naming its own (the same reservation), a second buyer filling the other variant,
/// then the first buyer over the limit across both.
#[test]
fn a_key_stays_with_its_variant_and_the_limit_spans_both() {
    let b = |user, variant, qty, key| Buy {
        user,
        variant,
        qty,
        key,
        short: false,
    };
    play(&[
        Op::Reserve(b(0, 0, 1, Some(0))),
        Op::Reserve(b(0, 1, 1, Some(0))),
        Op::Reserve(b(0, 0, 1, Some(0))),
        Op::Reserve(b(1, 1, 2, None)),
        Op::Reserve(b(0, 1, 2, None)),
        Op::Reserve(b(0, 1, 1, None)),
        Op::Burst(vec![
            b(2, 1, 2, Some(1)),
            b(2, 0, 2, Some(1)),
            b(2, 1, 1, None),
        ]),
        Op::AdminRelease { pick: 0 },
        Op::Reserve(b(0, 1, 2, None)),
    ]);
}
