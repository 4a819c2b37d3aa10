//! A model-based test of the whole stock lifecycle (proptest-state-machine): a reference model in
//! plain Rust predicts every answer, and random sequences of operations run against a real
//! redis-server (durable, `appendfsync always`), the real scripts and the same Rust code the
//! gateway runs (admission's check and take, the lifecycle's releases, confirms, admin calls and
//! sweeps, the stock layer's prewarm), on two gateway instances whose configurations drift apart.
//! A failure is shrunk to a minimal sequence.
//!
//! Operations: reserve with and without `Idempotency-Key` (and replays), a forwarded request
//! failing (5xx, timeout, cut body, queue timeout: the proxy gives back what it made), a 2xx
//! confirming, a lost reply abandoned, a reserve arriving after its own abandon, admin confirm
//! and release, holds running out, sweeps (with the order lookup answering found, not found or
//! nothing), prewarm ticks, reloads (a new version, an older one, limits, `ends_at`, the sale
//! postponed or cut short and reopened, `segments`, removing and re-adding an activity), a Redis
//! restart, and the retention passing. Outside the hours only a keyed replay gets anything.
//! And the store forgetting (issue 33), on the unsegmented activity: its keys emptied (the
//! floor too), taken back to an older snapshot, or a hash evicted; an operator's plain resume
//! and a resume with the counted remaining stock (the count an SRE makes: the stock less what
//! the backend holds). However Redis forgets, nothing is sold twice: every unit a buyer was told
//! was theirs counts against the stock, remembered or not.
//!
//! After every step, against Redis: every reservation in the state the model says (states only
//! move forward), every user's units as the model says and never over the limit in force when
//! they were taken, each version's stock as the model says and never oversold, and `flashgate
//! reconcile` clean (every ledger balanced, and agreeing with the records).
//!
//! The gateways' clocks are not an input: no stock call takes a time from the gateway (holds,
//! deadlines and sweeps use Redis's TIME); a hold running out is simulated by moving that
//! reservation's deadline (in its record) and due time (in the pending set) into the past.
//!
//! `PROPTEST_CASES` sets the number of sequences (`scripts/reliability integrity --long` runs
//! many); every sequence proptest finds is kept as a regression case in
//! `tests/model.proptest-regressions`.

#[path = "support/mod.rs"]
mod support;

use flashgate::config::Settings;
use flashgate::lifecycle::{AdminOutcome, HandedOut};
use flashgate::reservation::Reservation;
use flashgate::sale::{SaleState, SaleView};
use flashgate::stock::ReleaseReason;
use flashgate::stock::{segments, ConfirmedVia, Layout, ReleaseMode, StockStore};
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use support::pipeline::{self, Instance};
use support::*;

/// The activities: one in a single segment, one split; (id, stock, segments first configured).
const ACTS: [(&str, u64, u32); 2] = [("plain", 6, 1), ("split", 9, 3)];
/// Buyers (one id with '|' and a space: user ids are the record's last field).
const USERS: [&str; 4] = ["ann", "bob", "c|d e", "dan"];
const INSTANCES: usize = 2;

// ---------------------------------------------------------------------------------------------
// The reference model.

/// Where the sale's hours stand, as one instance's YAML has them (always hours from the
/// boundaries: gateway and Redis agree on the side of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hours {
    Open,
    /// Postponed: `starts_at` half a day ahead.
    NotStarted,
    /// Cut short: `ends_at` an hour ago.
    Ended,
}

impl Hours {
    /// The refusal of a purchase outside the hours.
    fn refusal(self) -> Option<&'static str> {
        match self {
            Hours::Open => None,
            Hours::NotStarted => Some("not_started"),
            Hours::Ended => Some("ended"),
        }
    }
}

/// One activity as one instance's YAML has it.
#[derive(Clone, Debug, PartialEq)]
struct ActConf {
    version: u64,
    limit: u32,
    segments: u32,
    ends_in_days: i64,
    hours: Hours,
}

impl ActConf {
    fn first(act: usize) -> ActConf {
        ActConf {
            version: 1,
            limit: 2,
            segments: ACTS[act].2,
            ends_in_days: 30,
            hours: Hours::Open,
        }
    }

    fn max_per_request(&self) -> u64 {
        u64::from(self.limit.min(2))
    }
}

/// One instance's configuration: each activity, or none (removed).
type Conf = [Option<ActConf>; 2];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Pending,
    Confirmed,
    Released,
}

/// One reservation the model knows.
#[derive(Clone, Debug)]
struct Res {
    act: usize,
    user: usize,
    qty: u64,
    version: u64,
    state: St,
    /// An idempotent replay handed it to a second request.
    claimed: bool,
    /// Its hold ran out (the sweep settles it), and it is not leased to an order lookup.
    due: bool,
    /// Its hold deadline passed (for good: a keyed replay of it is refused while pending).
    ran_out: bool,
    /// Its keys expired with the activity's retention: nothing left to check.
    gone: bool,
    /// The backend accepted it after its release (counted once).
    late: bool,
    /// Released with its units back in its version's stock (else retired: the version was no
    /// longer on sale).
    returned: bool,
    /// Its fence: moved by every forward (the reserve, each replay) and every hand-out to an
    /// order lookup; a lookup's "not found" releases it only if nothing moved since.
    gen: u64,
    /// Who released it, once released.
    released_by: Option<&'static str>,
    /// Made in the unsegmented activity's one segment (its records hash is the one the
    /// store-forgetting operations act on).
    seg1: bool,
    /// Its units count as the buyer's (see `Model::out`): from its making to its release,
    /// whatever Redis later forgets or brings back.
    counted: bool,
    /// Accepted late and covered: a cover record holds its units (the buyer's again).
    covered: bool,
    /// The store went back to a snapshot from before a replay handed it on: Redis forgot the
    /// hand-over (its record has no `r` flag again), so the request that made it may give it
    /// back while the replay's forward is at the backend; the backend's acceptance then counts
    /// as accepted late (covered or oversold), as for any release before a 2xx.
    forgot_handover: bool,
    /// Held in doubt (flag `d`, lua/doubt.lua): pending when an operator resumed its segment
    /// after a fence or recounted it; its hold's expiry never releases it (the order lookup's
    /// "no order", a confirm or a release do).
    in_doubt: bool,
    /// Held in doubt and parked (its pending score is HELD, lib.lua): no sweep finds it due; a
    /// sweep with an order lookup hands it out once its hold ran out.
    parked: bool,
}

/// One request that got a reservation (made, or replayed to it).
#[derive(Clone, Debug)]
struct Handle {
    res: usize,
    owned: bool,
    /// Its forward is at the backend (sent, not answered): sent and answered are two steps,
    /// with any other operation between them.
    open: bool,
    /// The reservation's fence when this request was forwarded.
    gen: u64,
}

/// A reservation a sweep handed out to ask the backend about (order lookup), answer pending.
#[derive(Clone, Debug)]
struct LookupOut {
    res: usize,
    /// The fence the hand-out set.
    gen: u64,
    open: bool,
}

#[derive(Clone, Debug)]
struct Version {
    initial: u64,
    /// Units in stock (while the version is on sale).
    left: u64,
    /// Units the backend accepted after their reservation was released (never clean).
    late: u64,
    /// Of those, units a cover took from stock (a confirmed cover record), and units oversold.
    covered: u64,
    oversold: u64,
    /// Units its ledger counts sold whose records were evicted (until a recount).
    unrecorded: u64,
}

/// One activity as Redis holds it.
#[derive(Clone, Debug, Default)]
struct ActModel {
    segments: Option<u32>,
    /// The version on sale (also the newest claimed: prewarm claims and creates in one step).
    current: Option<u64>,
    versions: BTreeMap<u64, Version>,
    held: BTreeMap<usize, u64>,
    idem: BTreeMap<(usize, u8), usize>,
    /// The newest version ever claimed: outlives the retention (the one key that never expires).
    floor: Option<u64>,
    /// A placeholder removed by hand (the unsegmented segment): refused until the keys expire.
    damaged: Option<Lost>,
    /// The unsegmented activity's segment only (the store-forgetting operations act there):
    /// fields of its records hash besides the placeholder (reservations, tombstones, covers).
    records: u64,
    /// The records' life (0: the placeholder is gone; see `records_of` in lua/lib.lua).
    life: u64,
    /// Marked lost (the version it was stamped with): the master record says `lost`.
    lost: Option<u64>,
    /// The master identity recorded (by a resume, an armed check or a recount).
    record: Option<u64>,
    /// When each version went on sale here (the meta's `v:<version>`, on the model's clock
    /// `Model::lives`), and when the segment was last recounted.
    births: BTreeMap<u64, u64>,
    recounted_at: u64,
    /// Its records hash was evicted holding reservations its ledgers count: the ledgers and
    /// the records disagree (reconcile says so) until a recount rebuilds the counts.
    forgot_records: bool,
}

/// The unsegmented activity as a snapshot kept it, with its reservations (by index).
type Snapshot = (ActModel, Vec<(usize, Res)>);

/// How Redis forgets the unsegmented activity's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forget {
    /// Every key of the activity, its floor too (Redis restarted empty, a FLUSHALL).
    Emptied,
    /// Back to the snapshot taken last (an older RDB).
    Older,
    /// A whole hash evicted (DEL): its data and its placeholder.
    Evicted(Lost),
}

/// What the one stock store both instances share remembers (a process's memory, outliving
/// every key in Redis), of the unsegmented activity.
#[derive(Clone, Debug, Default)]
struct StoreMemory {
    /// Versions (activity, version) it saw on sale: never created again.
    seen_on_sale: BTreeMap<(usize, u64), u64>,
    /// The most records it saw the segment hold when it acknowledged a sale (HLEN units), and
    /// their life.
    mark: (u64, u64),
    /// It knows the segment fenced (a reserve or a master call found it so).
    fenced: bool,
    /// The master identity it last saw accepted.
    expected: Option<u64>,
}

/// The key an operator removed by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lost {
    /// The users hash's placeholder: the per-user units can no longer be trusted.
    Users,
    /// The records' placeholder.
    Res,
}

/// What an operation is expected to answer.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Nothing,
    /// One expectation per item of a batch.
    Batch(Vec<Expect>),
    /// A reserve's decision code, and for `admitted` the reservation (made or replayed).
    Decision(&'static str, Option<(usize, bool)>),
    Admin(&'static str),
}

#[derive(Clone, Debug)]
struct Model {
    /// The activities the last operation could have changed (invariants are checked on those).
    touched: [bool; 2],
    conf: [Conf; INSTANCES],
    acts: [ActModel; 2],
    res: Vec<Res>,
    handles: Vec<Handle>,
    lookups: Vec<LookupOut>,
    /// The activities each instance remembers as refused by Redis.
    refused: [[bool; 2]; INSTANCES],
    /// The sold-out cache (shared: news reach every instance at once in this model).
    sold_out: BTreeSet<(usize, u64)>,
    expect: Expect,
    store: StoreMemory,
    /// Redis's master identity: moved by every restart.
    replid: u64,
    /// The last snapshot of the unsegmented activity's keys, with its reservations' states.
    snapshot: Option<Box<Snapshot>>,
    /// Lives handed out so far.
    lives: u64,
    /// Units of each (activity, version) a buyer was told were theirs and not given back
    /// (covers included): what the backend may hold, however Redis forgets. Never more than
    /// the stock: nothing sold twice.
    out: BTreeMap<(usize, u64), u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lookup {
    Found,
    NotFound,
    Unanswered,
}

#[derive(Clone, Debug)]
enum Change {
    Bump,
    Older,
    Limit(u32),
    EndsAt(i64),
    Hours(Hours),
    Segments(u32),
    Remove,
    ReAdd,
}

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        inst: usize,
        act: usize,
        user: usize,
        qty: u64,
        key: Option<u8>,
    },
    /// Purchases arriving on one instance while its reserve of the same segment and version is
    /// out: sent together in one script call, judged in arrival order (each item: user, qty,
    /// key). Only where nothing before the reserve waits on Redis (the version on sale, one
    /// segment, open hours), so that arrival order is the list's.
    Batch {
        inst: usize,
        act: usize,
        items: Vec<(usize, u64, Option<u8>)>,
    },
    /// The request's upstream failed (5xx, timeout, a cut body, the queue): the proxy gives back
    /// what it made.
    Fail {
        handle: usize,
    },
    /// The upstream answered 2xx (`confirm: upstream`).
    UpstreamOk {
        handle: usize,
    },
    /// The reserve's reply was lost: admission abandons the id it made.
    LostReply {
        handle: usize,
    },
    /// The forward ended without the backend's answer (a timeout, a broken connection): the
    /// gateway asks for the reservation to be settled (order lookup) as soon as no forward of
    /// it can still be at the backend.
    TimedOut {
        handle: usize,
    },
    /// The abandon of a timed-out reserve lands before the reserve itself.
    LateReserve {
        inst: usize,
        act: usize,
        user: usize,
    },
    AdminConfirm {
        inst: usize,
        res: usize,
    },
    AdminRelease {
        inst: usize,
        res: usize,
    },
    HoldRunsOut {
        res: usize,
    },
    /// A sweep without an order lookup: what is due and past its hold deadline expires.
    Sweep {
        inst: usize,
    },
    /// A sweep with an order lookup hands what is due out to ask the backend about (the
    /// answers land later, one by one).
    HandOut {
        inst: usize,
    },
    /// The backend's answer to one lookup handed out earlier lands.
    LookupAnswer {
        lookup: usize,
        answer: Lookup,
    },
    Prewarm {
        inst: usize,
    },
    Reconfigure {
        inst: usize,
        act: usize,
        change: Change,
    },
    /// One instance takes the other's configuration (a reload catching up).
    Sync {
        inst: usize,
    },
    RestartRedis,
    /// The retention after the sale passed: every key of the activity is gone.
    Expire {
        act: usize,
    },
    /// An operator removes a key of the unsegmented activity's segment by hand.
    Damage {
        lost: Lost,
    },
    /// Redis forgets the unsegmented activity's keys.
    Forget {
        how: Forget,
    },
    /// A snapshot of the unsegmented activity's keys is taken (restored by `Forget::Older`).
    Snapshot,
    /// An operator's plain resume of the unsegmented activity (POST .../resume).
    Resume {
        inst: usize,
    },
    /// An operator's resume with the counted remaining stock (`{"remaining": N}`), N the
    /// stock less every unit a buyer was told was theirs.
    Recount {
        inst: usize,
        remaining: u64,
    },
}

impl Model {
    /// Both instances with the same configuration; nothing in Redis yet.
    fn initial() -> Model {
        let conf: Conf = [Some(ActConf::first(0)), Some(ActConf::first(1))];
        Model {
            touched: [true; 2],
            conf: [conf.clone(), conf],
            acts: Default::default(),
            res: Vec::new(),
            handles: Vec::new(),
            lookups: Vec::new(),
            refused: [[false; 2]; INSTANCES],
            sold_out: BTreeSet::new(),
            expect: Expect::Nothing,
            store: StoreMemory::default(),
            replid: 0,
            snapshot: None,
            lives: 0,
            out: BTreeMap::new(),
        }
    }

    fn stock(act: usize) -> u64 {
        ACTS[act].1
    }

    /// Units go back to their version if it is still on sale, else are retired; the
    /// instance's sold-out mark of that version is cleared either way.
    fn give_back(&mut self, r: usize, by: &'static str) {
        let res = self.res[r].clone();
        self.res[r].state = St::Released;
        self.res[r].due = false;
        self.res[r].released_by = Some(by);
        if res.counted {
            self.res[r].counted = false;
            *self.out.entry((res.act, res.version)).or_default() -= res.qty;
        }
        let act = &mut self.acts[res.act];
        if act.damaged != Some(Lost::Users) {
            // (saturating: a users hash made again holds only what the records still said)
            let held = act.held.entry(res.user).or_default();
            *held = held.saturating_sub(res.qty);
        }
        let on_sale = act.current == Some(res.version);
        if on_sale {
            act.versions.get_mut(&res.version).unwrap().left += res.qty;
        }
        self.res[r].returned = on_sale;
        self.sold_out.remove(&(res.act, res.version));
    }

    /// The backend says it took a reservation (a 2xx, or its order lookup found it): confirmed
    /// if pending; if the gateway released it (anything but an admin call), accepted late,
    /// once: covered while nobody else can have its units (see [`Model::late_covered`]), else
    /// oversold.
    fn backend_took(&mut self, r: usize) {
        let res = self.res[r].clone();
        match res.state {
            _ if res.gone => {}
            St::Pending => {
                self.res[r].state = St::Confirmed;
                self.res[r].due = false;
            }
            St::Confirmed => {}
            St::Released if res.late || res.released_by == Some("admin") => {}
            St::Released => {
                self.res[r].late = true;
                let covered = self.late_covered(r);
                let act = &mut self.acts[res.act];
                let on_sale = act.current == Some(res.version);
                let version = act.versions.get_mut(&res.version).unwrap();
                version.late += res.qty;
                if covered {
                    // From the stock on sale, or from the unsold units retired with the version
                    // (the model's `left` of a retired version stays what was left then); its
                    // own units retired at the release were never sold again.
                    if on_sale || res.returned {
                        version.left -= res.qty;
                    }
                    version.covered += res.qty;
                    self.res[r].covered = true;
                    let act = &mut self.acts[res.act];
                    if act.damaged != Some(Lost::Users) {
                        *act.held.entry(res.user).or_default() += res.qty;
                    }
                    // The cover is a record of its own, in the reservation's segment.
                    if res.seg1 {
                        act.records += 1;
                    }
                    *self.out.entry((res.act, res.version)).or_default() += res.qty;
                } else {
                    version.oversold += res.qty;
                }
            }
        }
    }

    /// Whether the units of released reservation `r`, accepted late, can be covered: its
    /// version on sale with them in stock, or retired with its units (retired at the release,
    /// or returned and still among the unsold when the version was retired).
    fn late_covered(&self, r: usize) -> bool {
        let res = &self.res[r];
        let act = &self.acts[res.act];
        let version = &act.versions[&res.version];
        if act.current == Some(res.version) {
            version.left >= res.qty
        } else {
            !res.returned || version.left >= res.qty
        }
    }

    /// Whether the backend taking reservation `r` now is beyond the model: a released one of a
    /// segmented activity whose version still has the units somewhere is covered only if its
    /// own segment has them, and the model does not follow units between segments. The
    /// generator leaves such answers out (the unsegmented activity covers the rule exactly;
    /// tests/scripts.rs covers a segment's own cover).
    fn cover_unpredictable(&self, r: usize) -> bool {
        let res = &self.res[r];
        let act = &self.acts[res.act];
        res.state == St::Released
            && !res.late
            && !res.gone
            && res.released_by != Some("admin")
            && act.segments.is_some_and(|s| s > 1)
            && self.late_covered(r)
    }

    /// The prewarm both a tick and a reserve that found no stock key run: refused when Redis
    /// recorded another segment count or a newer version; else the version goes on sale.
    fn prewarm(&mut self, inst: usize, a: usize, c: &ActConf) -> bool {
        let act = &mut self.acts[a];
        // The floor outlives the keys: a version once claimed never sells again after they
        // expired (a new version sells afresh), and an older one never.
        let below_floor = act
            .floor
            .is_some_and(|f| c.version < f || (c.version == f && act.current.is_none()));
        let refused = act.segments.is_some_and(|s| s != c.segments)
            || act.current.is_some_and(|cur| c.version < cur)
            || below_floor;
        if refused {
            self.refused[inst][a] = true;
            return false;
        }
        // Claimed (the floor moves, the meta records the segment count), then the segment
        // refuses if it was marked lost for this version or a later one, or damaged (which
        // marks it lost).
        act.floor = act.floor.max(Some(c.version));
        act.segments = Some(c.segments);
        let ours = a == 0 && c.segments == 1;
        // (the store remembers what it saw on sale whatever the layout; a loss is marked in
        // segment 0, the unsegmented activity's one segment, under any layout)
        if a == 0 && act.lost.is_some_and(|stamp| c.version <= stamp) {
            return self.lost_found(inst, a, c);
        }
        if act.damaged.is_some() {
            if ours {
                return self.lost_found(inst, a, c);
            }
            self.refused[inst][a] = true;
            return false;
        }
        if a == 0
            && self
                .store
                .seen_on_sale
                .keys()
                .any(|&(x, v)| x == a && v > c.version)
        {
            // A newer version seen on sale and the claim passed: the store forgot its floor.
            return self.lost_found(inst, a, c);
        }
        if a == 0 && act.current == Some(c.version) {
            // Made again by another birth than the one remembered (an older snapshot, or keys
            // another gateway made again), and no recount since: the store forgot.
            let born = act.births.get(&c.version).copied().unwrap_or(0);
            let remembered = self.store.seen_on_sale.get(&(a, c.version)).copied();
            if remembered.is_some_and(|r| r != 0 && r != born) && act.recounted_at < born {
                return self.lost_found(inst, a, c);
            }
        }
        if act.current != Some(c.version) {
            if a == 0 && self.store.seen_on_sale.contains_key(&(a, c.version)) {
                // Seen on sale, and its keys are gone: never made again.
                return self.lost_found(inst, a, c);
            }
            if a == 0 && act.lost.is_some() {
                // A newer version over a loss: sells afresh, its records in a new life.
                act.lost = None;
                if act.life != 0 {
                    self.lives += 1;
                    act.life = self.lives;
                }
            }
            act.current = Some(c.version);
            // Accepted under the master answering now from its first unit (lua/prewarm.lua);
            // the model follows the fence of the unsegmented layout's segment only.
            if a == 0 && c.segments == 1 {
                act.record.get_or_insert(self.replid);
            }
            self.lives += 1;
            act.births.insert(c.version, self.lives);
            act.versions.insert(
                c.version,
                Version {
                    initial: Self::stock(a),
                    left: Self::stock(a),
                    late: 0,
                    covered: 0,
                    oversold: 0,
                    unrecorded: 0,
                },
            );
        }
        if ours && act.life == 0 {
            // The records' placeholder made: a new life.
            self.lives += 1;
            act.life = self.lives;
        }
        let birth = act.births.get(&c.version).copied().unwrap_or(0);
        self.store.seen_on_sale.insert((a, c.version), birth);
        true
    }

    /// The prewarm found the unsegmented activity's segment holding less than was sold: it
    /// is marked lost (the mark of an earlier loss is kept), the store knows it fenced, and the
    /// instance refuses the activity.
    fn lost_found(&mut self, inst: usize, a: usize, c: &ActConf) -> bool {
        let act = &mut self.acts[a];
        if act.lost.is_none() {
            // Stamped with the version on sale, or the caller's when a newer one is on sale in
            // another layout (a stale configuration's layout: the newer version sells in its
            // own, which the mark does not touch).
            let elsewhere = act.segments.is_some_and(|s| s != c.segments);
            act.lost = Some(match act.current {
                Some(current) if current > c.version && elsewhere => c.version,
                current => current.unwrap_or(c.version),
            });
        }
        act.record = None;
        self.store.fenced = true;
        self.refused[inst][a] = true;
        false
    }

    /// Whether the unsegmented activity's loss stands for the version on sale: a newer version
    /// on sale than the one marked sells afresh (in its own layout), and neither resume nor
    /// reconcile of it names the older version's mark.
    fn lost_stands(&self) -> bool {
        let act = &self.acts[0];
        act.lost
            .is_some_and(|stamp| act.current.is_none_or(|current| current <= stamp))
    }

    /// Whether the master script lets a call take stock in the unsegmented activity's segment
    /// (`master_holds` in lua/lib.lua): the recorded identity is this master's; none recorded,
    /// the store remembers none or this master's; never once marked lost.
    fn master_holds(&self) -> bool {
        let act = &self.acts[0];
        act.lost.is_none()
            && match act.record {
                Some(r) => r == self.replid,
                None => self.store.expected.is_none_or(|e| e == self.replid),
            }
    }

    /// Whether the unsegmented activity's segment holds fewer records of their life than the
    /// store saw it hold when it acknowledged a sale there (`went_back` in lua/lib.lua).
    fn went_back(&self) -> bool {
        let act = &self.acts[0];
        let (most, seen) = self.store.mark;
        act.life != 0
            && seen != 0
            && (act.life < seen || (act.life == seen && act.records + 1 < most))
    }

    /// Whether a sweep of reservation `r` does nothing (`lua/sweep.lua`): it is in the
    /// unsegmented activity's segment and the store, by its fencing token, finds that segment
    /// fenced, lost or gone back (in doubt, hold: an expiry proves nothing there).
    fn sweep_fenced(&self, r: usize) -> bool {
        let res = &self.res[r];
        res.act == 0 && res.seg1 && (!self.master_holds() || self.went_back())
    }

    /// Holds in doubt every reservation pending in the unsegmented activity's segment (an
    /// operator's resume of a fence, or a recount: `lua/doubt.lua`).
    fn hold_in_doubt(&mut self) {
        for res in self.res.iter_mut() {
            // (one already held is left as it is: parked, or made due since)
            if res.act == 0 && res.seg1 && !res.gone && res.state == St::Pending && !res.in_doubt {
                res.in_doubt = true;
                res.parked = true;
                res.due = false;
            }
        }
    }

    /// Whether the unsegmented activity's records hash (or its placeholder) is gone while the
    /// store saw it hold records (the master check's `gone` in lua/master.lua; the model's
    /// clock is always before the sale's keys are due to expire).
    fn records_gone(&self) -> bool {
        let (most, seen) = self.store.mark;
        self.acts[0].life == 0 && most > 0 && seen != 0
    }

    /// The store-side refusals of a call reaching the unsegmented activity's segment under
    /// `c`: the store's memory of a fence (before any call), then the script's (the master, or
    /// the segment went back), which the store then remembers.
    fn fenced(&mut self, a: usize, c: &ActConf) -> bool {
        if a != 0 || c.segments != 1 {
            return false;
        }
        if !self.store.fenced && (!self.master_holds() || self.went_back()) {
            self.store.fenced = true;
        }
        self.store.fenced
    }

    /// The store acknowledged a sale in activity `a` under `c` (a reservation made or handed
    /// out again): what it saw the unsegmented activity's segment hold.
    fn acknowledged(&mut self, a: usize, c: &ActConf) {
        if a != 0 || c.segments != 1 {
            return;
        }
        let act = &self.acts[0];
        let held = act.records + 1;
        if self.store.mark.1 == act.life {
            self.store.mark.0 = self.store.mark.0.max(held);
        } else if act.life > self.store.mark.1 {
            // (a count of an older life is ignored: lives are ordered)
            self.store.mark = (held, act.life);
        }
    }

    /// Everything a reserve checks, in the gateway's order, with the side effects of failing
    /// (refusals learned, sold-out marks) and of the prewarm on its path. `Ok` when it would take
    /// the units; a replay is answered here.
    fn reserve_checks(
        &mut self,
        inst: usize,
        a: usize,
        user: usize,
        qty: u64,
        key: Option<u8>,
    ) -> Result<ActConf, Expect> {
        let refuse = |code| Err(Expect::Decision(code, None));
        let Some(c) = self.conf[inst][a].clone() else {
            return refuse("unknown_activity");
        };
        if qty > c.max_per_request() {
            return refuse("bad_request");
        }
        if c.hours.refusal().is_some() {
            return Err(self.outside_hours(inst, a, user, key, qty, &c));
        }
        if key.is_none() && self.sold_out.contains(&(a, c.version)) {
            return refuse("sold_out");
        }
        if self.refused[inst][a] || self.fenced(a, &c) {
            return refuse("unavailable");
        }
        if self.damaged_here(a, &c) {
            // The script refuses a damaged segment before anything else, replays too; a
            // version not on sale there finds no stock key first, and the prewarm on the way
            // claims it (the floor moves) before the segment refuses.
            if self.acts[a].current != Some(c.version) {
                self.prewarm(inst, a, &c);
            }
            self.refused[inst][a] = true;
            return refuse("unavailable");
        }
        let layout_ok = self.acts[a].segments.is_none_or(|s| s == c.segments);
        if let Some(replayed) = self.replay(a, user, key, qty, &c) {
            return Err(replayed);
        }
        if self.acts[a].current != Some(c.version) && !self.prewarm(inst, a, &c) {
            return refuse("unavailable");
        }
        if !layout_ok {
            self.refused[inst][a] = true;
            return refuse("unavailable");
        }
        let act = &self.acts[a];
        let held = act.held.get(&user).copied().unwrap_or(0);
        if held + qty > u64::from(c.limit) {
            return refuse("limit_exceeded");
        }
        let left = act.versions[&c.version].left;
        if left < qty {
            if left == 0 {
                self.sold_out.insert((a, c.version));
            }
            return refuse("sold_out");
        }
        Ok(c)
    }

    /// The key's reservation, answered again, if it won one that is not released.
    fn replay(
        &mut self,
        a: usize,
        user: usize,
        key: Option<u8>,
        qty: u64,
        c: &ActConf,
    ) -> Option<Expect> {
        let layout_ok = self.acts[a].segments.is_none_or(|s| s == c.segments);
        let &r = key
            .filter(|_| layout_ok)
            .and_then(|k| self.acts[a].idem.get(&(user, k)))?;
        if self.res[r].gone {
            // Its record is gone (evicted): the key won nothing Redis knows of.
            return None;
        }
        if self.res[r].state == St::Pending && self.res[r].ran_out {
            // Being settled (expiry or order lookup): never handed out again.
            return Some(Expect::Decision("unavailable", None));
        }
        if self.res[r].state == St::Released {
            return None;
        }
        if self.res[r].qty != qty {
            // Not this purchase's retry: never forwarded with its claims.
            return Some(Expect::Decision("bad_request", None));
        }
        self.res[r].claimed = true;
        if self.res[r].state == St::Pending {
            // Forwarded again: the fence moves, and it is not due while this forward is out.
            self.res[r].gen += 1;
            self.res[r].due = false;
        }
        let gen = self.res[r].gen;
        let act = &self.acts[a];
        let empty = act.current == Some(c.version) && act.versions[&c.version].left == 0;
        if c.segments == 1 && empty {
            self.sold_out.insert((a, c.version));
        }
        self.handles.push(Handle {
            res: r,
            owned: false,
            open: true,
            gen,
        });
        self.acknowledged(a, c);
        Some(Expect::Decision("admitted", Some((r, true))))
    }

    /// A purchase outside the sale's hours: refused at once without a key; with one, the
    /// store is asked replay only (the activity's refusal learned first; a segment never put
    /// on sale in this layout is not prewarmed), and the key's reservation answered, or the
    /// refusal.
    fn outside_hours(
        &mut self,
        inst: usize,
        a: usize,
        user: usize,
        key: Option<u8>,
        qty: u64,
        c: &ActConf,
    ) -> Expect {
        let closed = c.hours.refusal().expect("outside the hours");
        let refuse = |code| Expect::Decision(code, None);
        if key.is_none() {
            return refuse(closed);
        }
        if self.refused[inst][a] || self.fenced(a, c) {
            return refuse("unavailable");
        }
        if self.damaged_here(a, c) {
            // A replay-only call finding no stock key of this version puts nothing on sale.
            if self.acts[a].current != Some(c.version) {
                return refuse(closed);
            }
            self.refused[inst][a] = true;
            return refuse("unavailable");
        }
        if let Some(replayed) = self.replay(a, user, key, qty, c) {
            return replayed;
        }
        // A segment never put on sale in this layout is not prewarmed on the way: the key
        // won nothing there.
        refuse(closed)
    }

    /// Whether a reserve under configuration `c` reaches a segment with a key removed.
    fn damaged_here(&self, a: usize, c: &ActConf) -> bool {
        let act = &self.acts[a];
        act.damaged.is_some() && act.segments == Some(c.segments)
    }

    fn reserve(&mut self, inst: usize, a: usize, user: usize, qty: u64, key: Option<u8>) -> Expect {
        let c = match self.reserve_checks(inst, a, user, qty, key) {
            Ok(c) => c,
            Err(expect) => return expect,
        };
        let act = &mut self.acts[a];
        let version = act.versions.get_mut(&c.version).unwrap();
        version.left -= qty;
        let now_empty = version.left == 0;
        *act.held.entry(user).or_default() += qty;
        let seg1 = a == 0 && c.segments == 1;
        if seg1 {
            act.records += 1;
        }
        // (checked against the stock in `check_invariants`, where a failure shrinks)
        *self.out.entry((a, c.version)).or_default() += qty;
        let r = self.res.len();
        if let Some(k) = key {
            act.idem.insert((user, k), r);
        }
        if c.segments == 1 && now_empty {
            self.sold_out.insert((a, c.version));
        }
        self.res.push(Res {
            act: a,
            user,
            qty,
            version: c.version,
            state: St::Pending,
            claimed: false,
            due: false,
            ran_out: false,
            gone: false,
            late: false,
            returned: false,
            gen: 1,
            released_by: None,
            seg1,
            counted: true,
            covered: false,
            forgot_handover: false,
            in_doubt: false,
            parked: false,
        });
        self.handles.push(Handle {
            res: r,
            owned: true,
            open: true,
            gen: 1,
        });
        self.acknowledged(a, &c);
        Expect::Decision("admitted", Some((r, false)))
    }

    /// Whether purchases of `a` on `inst` reach the reserve without waiting on Redis first (no
    /// prewarm on the way, no rebalancing), so a batch's arrival order is its list's.
    fn batchable(&self, inst: usize, a: usize) -> bool {
        let act = &self.acts[a];
        self.conf[inst][a].as_ref().is_some_and(|c| {
            c.segments == 1
                && c.hours == Hours::Open
                && act.segments == Some(1)
                && act.current == Some(c.version)
                && act.damaged.is_none()
                && !self.refused[inst][a]
                && (a != 0 || (!self.store.fenced && self.master_holds() && !self.went_back()))
        })
    }

    /// A batch: each item as a reserve in list order, except that the sold-out marks the
    /// items check before the call are those of the batch's start (every item was on its way
    /// before any answer came back); marks learned from the answers count after it.
    fn batch(&mut self, inst: usize, a: usize, items: &[(usize, u64, Option<u8>)]) -> Expect {
        let start = self.sold_out.clone();
        let mut learned = BTreeSet::new();
        let expects = items
            .iter()
            .map(|&(user, qty, key)| {
                self.sold_out = start.clone();
                let expect = self.reserve(inst, a, user, qty, key);
                learned.extend(self.sold_out.iter().copied());
                expect
            })
            .collect();
        self.sold_out = learned;
        Expect::Batch(expects)
    }

    /// A reserve under an id already tombstoned by its abandon: every check as usual, but
    /// where it would take units it finds its id used, changes nothing and answers
    /// `unavailable`.
    fn late_reserve(&mut self, inst: usize, a: usize, user: usize) -> Expect {
        match self.reserve_checks(inst, a, user, 1, None) {
            Ok(_) => Expect::Decision("unavailable", None),
            Err(expect) => expect,
        }
    }

    /// Whether an operator's resume can be modelled on `inst`: it configures the unsegmented
    /// activity in one segment.
    fn operable(&self, inst: usize) -> bool {
        self.conf[inst][0].as_ref().is_some_and(|c| c.segments == 1)
    }

    /// The SRE's count for `inst`'s version of the unsegmented activity: the stock less every
    /// unit a buyer was told was theirs and did not give back (what the backend may hold).
    fn count(&self, inst: usize) -> u64 {
        let Some(c) = &self.conf[inst][0] else {
            return 0;
        };
        let out = self.out.get(&(0, c.version)).copied().unwrap_or(0);
        Self::stock(0).saturating_sub(out)
    }

    /// Redis forgets the unsegmented activity's keys. The store remembers what it did.
    fn forget(&mut self, how: Forget) {
        match how {
            Forget::Emptied => {
                self.acts[0] = ActModel::default();
                for res in self.res.iter_mut().filter(|r| r.act == 0) {
                    res.gone = true;
                }
            }
            Forget::Older => {
                let (act, res) = *self.snapshot.clone().expect("a snapshot");
                self.acts[0] = act;
                let kept: BTreeMap<usize, Res> = res.into_iter().collect();
                for (r, res) in self.res.iter_mut().enumerate().filter(|(_, r)| r.act == 0) {
                    let counted = res.counted;
                    let handed_over = res.claimed || res.forgot_handover;
                    match kept.get(&r) {
                        Some(then) => *res = then.clone(),
                        None => res.gone = true,
                    }
                    // Whether the buyer holds it is not Redis's to forget.
                    res.counted = counted;
                    res.forgot_handover = handed_over && !res.claimed;
                }
            }
            Forget::Evicted(lost) => {
                let act = &mut self.acts[0];
                act.damaged = Some(lost);
                match lost {
                    Lost::Users => act.held.clear(),
                    Lost::Res => {
                        act.records = 0;
                        act.life = 0;
                        for res in self.res.iter_mut().filter(|r| r.act == 0 && r.seg1) {
                            act.forgot_records |= !res.gone;
                            if !res.gone && res.state != St::Released {
                                if let Some(v) = act.versions.get_mut(&res.version) {
                                    v.unrecorded += res.qty;
                                }
                            }
                            res.gone = true;
                        }
                    }
                }
            }
        }
    }

    /// An operator's plain resume on `inst` (`StockStore::accept_master`): refused while the
    /// segment is lost, or found behind now (then marked lost); else the master answering now
    /// is accepted.
    fn resume(&mut self, inst: usize) -> Expect {
        let c = self.conf[inst][0].clone().expect("operable");
        if self.lost_stands() {
            self.store.fenced = true;
            return Expect::Admin("lost");
        }
        if self.went_back() || self.records_gone() {
            // (a resume refuses nothing of the instance's, nor lifts its refusal: only the
            // store's fence)
            let refused = self.refused[inst][0];
            self.lost_found(inst, 0, &c);
            self.refused[inst][0] = refused;
            return Expect::Admin("lost");
        }
        if !self.master_holds() {
            // A fence stands: what is pending under it is held in doubt before the accept.
            self.hold_in_doubt();
        }
        self.acts[0].record = Some(self.replid);
        self.store.expected = Some(self.replid);
        self.store.fenced = false;
        Expect::Admin("ok")
    }

    /// An operator's resume with the count (`Lifecycle::recount`) on `inst`: the claim's
    /// refusals, another version on sale; else the version sells `remaining` from now, its
    /// records in a new life, the loss lifted and the master answering now accepted.
    fn recount(&mut self, inst: usize, remaining: u64) -> Expect {
        let c = self.conf[inst][0].clone().expect("operable");
        // A count leaving fewer units than the ledgers still count sold is refused first.
        let held = self.acts[0].versions.get(&c.version).map_or(0, |v| {
            self.res
                .iter()
                .filter(|r| r.act == 0 && !r.gone && r.version == c.version)
                .filter(|r| r.state != St::Released)
                .map(|r| r.qty)
                .sum::<u64>()
                + v.covered
                + v.unrecorded
        });
        if remaining > Self::stock(0).saturating_sub(held) {
            return Expect::Admin("held");
        }
        let replid = self.replid;
        let act = &mut self.acts[0];
        let refused = act.segments.is_some_and(|s| s != c.segments)
            || act.current.is_some_and(|cur| c.version < cur)
            || act.floor.is_some_and(|f| c.version < f);
        if refused || act.current.is_some_and(|cur| cur != c.version) {
            return Expect::Admin("refused");
        }
        act.floor = act.floor.max(Some(c.version));
        act.segments = Some(1);
        if act.records == 0 && act.life == 0 {
            // The records hash is gone: so is every count that stood for its records.
            for version in act.versions.values_mut() {
                version.covered = 0;
            }
        }
        for version in act.versions.values_mut() {
            version.unrecorded = 0;
        }
        if act.damaged == Some(Lost::Users) {
            // The users hash is made again from the records still held.
            act.held.clear();
            for res in self.res.iter().filter(|r| r.act == 0 && r.seg1 && !r.gone) {
                if res.state != St::Released || res.covered {
                    *act.held.entry(res.user).or_default() += res.qty;
                }
            }
        }
        if let std::collections::btree_map::Entry::Vacant(e) = act.births.entry(c.version) {
            self.lives += 1;
            e.insert(self.lives);
        }
        self.lives += 1;
        act.life = self.lives;
        act.recounted_at = self.lives;
        let birth = act.births[&c.version];
        // (held in doubt before the count is set: what is pending may be a forgotten sale)
        self.hold_in_doubt();
        let act = &mut self.acts[0];
        let version = act.versions.entry(c.version).or_insert(Version {
            initial: Self::stock(0),
            left: 0,
            late: 0,
            covered: 0,
            oversold: 0,
            unrecorded: 0,
        });
        version.left = remaining;
        act.current = Some(c.version);
        act.lost = None;
        act.record = Some(replid);
        act.damaged = None;
        act.forgot_records = false;
        self.store.fenced = false;
        self.store.seen_on_sale.insert((0, c.version), birth);
        self.refused[inst][0] = false;
        self.sold_out.remove(&(0, c.version));
        Expect::Admin("ok")
    }

    /// The instance's admin API can find a reservation when its configuration has the
    /// activity with the segment count Redis recorded.
    fn admin_sees(&self, inst: usize, r: usize) -> bool {
        // In the layout Redis recorded, whatever this instance's configuration says (review 12b
        // R8); an activity the instance does not configure is not found.
        let res = &self.res[r];
        !res.gone && self.conf[inst][res.act].is_some()
    }
}

impl ReferenceStateMachine for Model {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::initial()).boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Op> {
        let inst = 0..INSTANCES;
        let act = 0..2usize;
        let reserve = (
            inst.clone(),
            act.clone(),
            0..USERS.len(),
            1..=2u64,
            proptest::option::weighted(0.4, 0..2u8),
        )
            .prop_map(|(inst, act, user, qty, key)| Op::Reserve {
                inst,
                act,
                user,
                qty,
                key,
            });
        let change = prop_oneof![
            3 => Just(Change::Bump),
            1 => Just(Change::Older),
            2 => (1..=3u32).prop_map(Change::Limit),
            1 => (1..=60i64).prop_map(Change::EndsAt),
            1 => prop_oneof![Just(Hours::Open), Just(Hours::NotStarted), Just(Hours::Ended)]
                .prop_map(Change::Hours),
            1 => (1..=3u32).prop_map(Change::Segments),
            1 => Just(Change::Remove),
            1 => Just(Change::ReAdd),
        ];
        let mut ops: Vec<(u32, BoxedStrategy<Op>)> = vec![
            (12, reserve.boxed()),
            (
                1,
                (inst.clone(), act.clone(), 0..USERS.len())
                    .prop_map(|(inst, act, user)| Op::LateReserve { inst, act, user })
                    .boxed(),
            ),
            (1, inst.clone().prop_map(|inst| Op::Sweep { inst }).boxed()),
            (
                2,
                inst.clone().prop_map(|inst| Op::HandOut { inst }).boxed(),
            ),
            (
                1,
                inst.clone().prop_map(|inst| Op::Prewarm { inst }).boxed(),
            ),
            (
                2,
                (inst.clone(), act.clone(), change)
                    .prop_map(|(inst, act, change)| Op::Reconfigure { inst, act, change })
                    .boxed(),
            ),
            (1, inst.clone().prop_map(|inst| Op::Sync { inst }).boxed()),
            (1, Just(Op::RestartRedis).boxed()),
            (1, act.clone().prop_map(|act| Op::Expire { act }).boxed()),
        ];
        let batchable: Vec<(usize, usize)> = (0..INSTANCES)
            .flat_map(|i| (0..2).map(move |a| (i, a)))
            .filter(|&(i, a)| state.batchable(i, a))
            .collect();
        if !batchable.is_empty() {
            let item = (
                0..USERS.len(),
                1..=2u64,
                proptest::option::weighted(0.4, 0..2u8),
            );
            ops.push((
                4,
                (
                    proptest::sample::select(batchable),
                    proptest::collection::vec(item, 2..=5),
                )
                    .prop_map(|((inst, act), items)| Op::Batch { inst, act, items })
                    .boxed(),
            ));
        }
        if state.acts[0].segments == Some(1) && state.acts[0].damaged.is_none() {
            ops.push((
                1,
                prop_oneof![Just(Lost::Users), Just(Lost::Res)]
                    .prop_map(|lost| Op::Damage { lost })
                    .boxed(),
            ));
            ops.push((
                1,
                prop_oneof![Just(Lost::Users), Just(Lost::Res)]
                    .prop_map(|lost| Op::Forget {
                        how: Forget::Evicted(lost),
                    })
                    .boxed(),
            ));
        }
        ops.push((
            1,
            Just(Op::Forget {
                how: Forget::Emptied,
            })
            .boxed(),
        ));
        ops.push((1, Just(Op::Snapshot).boxed()));
        if state.snapshot.is_some() {
            ops.push((2, Just(Op::Forget { how: Forget::Older }).boxed()));
        }
        let operable: Vec<usize> = (0..INSTANCES).filter(|&i| state.operable(i)).collect();
        if !operable.is_empty() {
            let counts: Vec<u64> = (0..INSTANCES).map(|i| state.count(i)).collect();
            ops.push((
                1,
                proptest::sample::select(operable.clone())
                    .prop_map(|inst| Op::Resume { inst })
                    .boxed(),
            ));
            ops.push((
                2,
                proptest::sample::select(operable)
                    .prop_map(move |inst| Op::Recount {
                        inst,
                        remaining: counts[inst],
                    })
                    .boxed(),
            ));
        }
        // Answers only to what is out: a forward sent, a lookup handed out.
        let open: Vec<usize> = (0..state.handles.len())
            .filter(|&h| state.handles[h].open)
            .collect();
        let takeable: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&h| !state.cover_unpredictable(state.handles[h].res))
            .collect();
        if !takeable.is_empty() {
            ops.push((
                3,
                proptest::sample::select(takeable)
                    .prop_map(|handle| Op::UpstreamOk { handle })
                    .boxed(),
            ));
        }
        if !open.is_empty() {
            let h = proptest::sample::select(open);
            ops.push((3, h.clone().prop_map(|handle| Op::Fail { handle }).boxed()));
            ops.push((
                2,
                h.clone().prop_map(|handle| Op::TimedOut { handle }).boxed(),
            ));
            ops.push((1, h.prop_map(|handle| Op::LostReply { handle }).boxed()));
        }
        let asked: Vec<usize> = (0..state.lookups.len())
            .filter(|&l| state.lookups[l].open)
            .collect();
        if !asked.is_empty() {
            let answer = prop_oneof![
                Just(Lookup::Found),
                Just(Lookup::NotFound),
                Just(Lookup::Unanswered)
            ];
            ops.push((
                4,
                (proptest::sample::select(asked), answer)
                    .prop_map(|(lookup, answer)| Op::LookupAnswer { lookup, answer })
                    .boxed(),
            ));
        }
        if !state.res.is_empty() {
            let r = 0..state.res.len();
            ops.push((
                2,
                (inst.clone(), r.clone())
                    .prop_map(|(inst, res)| Op::AdminConfirm { inst, res })
                    .boxed(),
            ));
            ops.push((
                2,
                (inst.clone(), r.clone())
                    .prop_map(|(inst, res)| Op::AdminRelease { inst, res })
                    .boxed(),
            ));
            ops.push((3, r.prop_map(|res| Op::HoldRunsOut { res }).boxed()));
        }
        proptest::strategy::Union::new_weighted(ops).boxed()
    }

    fn preconditions(state: &Model, op: &Op) -> bool {
        match op {
            Op::UpstreamOk { handle } => state
                .handles
                .get(*handle)
                .is_some_and(|h| h.open && !state.cover_unpredictable(h.res)),
            Op::Fail { handle } | Op::LostReply { handle } | Op::TimedOut { handle } => {
                state.handles.get(*handle).is_some_and(|h| h.open)
            }
            // Only hashes that exist can lose their placeholder: none does while no version is
            // on sale in the segment (a prewarm refused after the store was emptied makes none).
            Op::Damage { .. }
            | Op::Forget {
                how: Forget::Evicted(_),
            } => {
                state.acts[0].segments == Some(1)
                    && state.acts[0].damaged.is_none()
                    && state.acts[0].current.is_some()
            }
            // The store forgetting is modelled in the unsegmented layout only: the model fences
            // no other segment (a segmented one gone back is refused by the system, safely,
            // where the model would sell), and its emptied store keeps the activity registry a
            // FLUSHALL would take (an emptied 2-segment layout recounted in 1 segment then reads
            // as a damaged segment 0: found by the generator while issue 45 was built, present
            // at 68bc4a4 too; open).
            Op::Forget {
                how: Forget::Emptied,
            } => state.acts[0].segments.is_none_or(|s| s == 1),
            Op::Forget { how: Forget::Older } => state.snapshot.as_ref().is_some_and(|snap| {
                snap.0.segments.is_none_or(|s| s == 1)
                    && state.acts[0].segments.is_none_or(|s| s == 1)
            }),
            Op::Resume { inst } | Op::Recount { inst, .. } => state.operable(*inst),
            Op::Batch { inst, act, .. } => state.batchable(*inst, *act),
            Op::LookupAnswer { lookup, answer } => state.lookups.get(*lookup).is_some_and(|l| {
                l.open && !(*answer == Lookup::Found && state.cover_unpredictable(l.res))
            }),
            Op::AdminConfirm { res, .. }
            | Op::AdminRelease { res, .. }
            | Op::HoldRunsOut { res } => *res < state.res.len(),
            _ => true,
        }
    }

    fn apply(mut state: Model, op: &Op) -> Model {
        state.expect = Expect::Nothing;
        state.touched = state.touched_by(op);
        match *op {
            Op::Reserve {
                inst,
                act,
                user,
                qty,
                key,
            } => {
                state.expect = state.reserve(inst, act, user, qty, key);
            }
            Op::Batch {
                inst,
                act,
                ref items,
            } => {
                state.expect = state.batch(inst, act, items);
            }
            Op::LateReserve { inst, act, user } => {
                // The abandon's tombstone lands first (a record of its own), but not into a
                // segment fenced, lost or gone back for the store (lua/release.lua).
                if act == 0
                    && state.conf[inst][0]
                        .as_ref()
                        .is_some_and(|c| c.segments == 1)
                    && state.master_holds()
                    && !state.went_back()
                {
                    state.acts[0].records += 1;
                }
                state.expect = state.late_reserve(inst, act, user);
            }
            Op::Fail { handle } | Op::LostReply { handle } => {
                // The request that made it gives it back (a failed forward, or a reserve whose
                // reply was lost: abandoned by id); never once a replay handed it on.
                let h = state.close(handle);
                let res = &state.res[h.res];
                // An abandon of an id Redis has no record of (a replay's fresh one, or one
                // whose record is gone) leaves a tombstone.
                // Not into a segment fenced, lost or gone back for the store (its count would
                // hide what the store forgot).
                if matches!(op, Op::LostReply { .. })
                    && (!h.owned || res.gone)
                    && res.seg1
                    && state.master_holds()
                    && !state.went_back()
                {
                    state.acts[0].records += 1;
                }
                let res = &state.res[h.res];
                if h.owned && !res.gone && res.state == St::Pending && !res.claimed {
                    state.give_back(h.res, "owner");
                }
            }
            Op::UpstreamOk { handle } => {
                let h = state.close(handle);
                let r = h.res;
                let res = &state.res[r];
                // The backend took an order whose units went back on sale: sold twice. Only an
                // explicit (admin) release may come first (the backend's own cancel); every
                // other release is fenced so it cannot happen while a forward is out.
                assert!(
                    res.gone
                        || res.state != St::Released
                        || res.released_by == Some("admin")
                        || res.forgot_handover,
                    "sold twice: reservation {r} was released by {:?} while a forward of it was at the backend",
                    res.released_by
                );
                state.backend_took(r);
            }
            Op::TimedOut { handle } => {
                // Due now only if no other forward of it can still be at the backend: none
                // since this one (the fence did not move) and none before it (a replay's
                // forward always has one before it, whose window is still open).
                let h = state.close(handle);
                let res = &mut state.res[h.res];
                if !res.gone && res.state == St::Pending && h.gen == res.gen && h.owned {
                    res.due = true;
                    res.parked = false;
                }
            }
            Op::AdminConfirm { inst, res } => {
                state.expect = Expect::Admin(if !state.admin_sees(inst, res) {
                    "not_found"
                } else {
                    match state.res[res].state {
                        St::Pending => {
                            state.res[res].state = St::Confirmed;
                            state.res[res].due = false;
                            "done"
                        }
                        St::Confirmed => "done",
                        St::Released => "conflict",
                    }
                });
            }
            Op::AdminRelease { inst, res } => {
                state.expect = Expect::Admin(if !state.admin_sees(inst, res) {
                    "not_found"
                } else {
                    if state.res[res].state != St::Released {
                        state.give_back(res, "admin");
                    }
                    "done"
                });
            }
            Op::HoldRunsOut { res } => {
                // Time passes beyond its hold deadline and every forward's longest trip: every
                // forward of it has ended (without an answer the gateway saw).
                for h in state.handles.iter_mut().filter(|h| h.res == res) {
                    h.open = false;
                }
                if !state.res[res].gone && state.res[res].state == St::Pending {
                    state.res[res].due = true;
                    state.res[res].ran_out = true;
                    state.res[res].parked = false;
                }
            }
            Op::Sweep { .. } => {
                for r in 0..state.res.len() {
                    let res = &state.res[r];
                    if res.gone || res.state != St::Pending || !res.due || state.sweep_fenced(r) {
                        continue;
                    }
                    if res.in_doubt {
                        // Held in doubt: parked, never released by expiry.
                        state.res[r].due = false;
                        state.res[r].parked = true;
                    } else if res.ran_out {
                        state.give_back(r, "expiry");
                    } else {
                        // Made due early for a lookup this instance does not make: it waits
                        // for its hold deadline.
                        state.res[r].due = false;
                    }
                }
            }
            Op::HandOut { .. } => {
                for r in 0..state.res.len() {
                    let fenced = state.sweep_fenced(r);
                    let res = &mut state.res[r];
                    let held_past_deadline = res.parked && res.ran_out;
                    if res.gone
                        || res.state != St::Pending
                        || !(res.due || held_past_deadline)
                        || fenced
                    {
                        continue;
                    }
                    res.parked = false;
                    res.due = false;
                    res.gen += 1;
                    let gen = res.gen;
                    state.lookups.push(LookupOut {
                        res: r,
                        gen,
                        open: true,
                    });
                }
            }
            Op::LookupAnswer { lookup, answer } => {
                state.lookups[lookup].open = false;
                let LookupOut { res: r, gen, .. } = state.lookups[lookup];
                let res = &state.res[r];
                match answer {
                    Lookup::Found => state.backend_took(r),
                    // Only if nothing moved the fence since the hand-out (a replay forwarded
                    // meanwhile, or a later hand-out).
                    // Not before the hold deadline (the token is still valid): due again then.
                    Lookup::NotFound if !res.gone && res.state == St::Pending && res.gen == gen => {
                        if res.ran_out {
                            state.give_back(r, "lookup");
                        } else {
                            state.res[r].due = false;
                        }
                    }
                    Lookup::NotFound | Lookup::Unanswered => {}
                }
            }
            Op::Prewarm { inst } => {
                for a in 0..2 {
                    // The background prewarm leaves a sale that is over alone.
                    if let Some(c) = state.conf[inst][a]
                        .clone()
                        .filter(|c| c.hours != Hours::Ended)
                    {
                        if state.prewarm(inst, a, &c) {
                            state.refused[inst][a] = false;
                        }
                    }
                }
            }
            Op::Reconfigure {
                inst,
                act,
                ref change,
            } => {
                let conf = &mut state.conf[inst][act];
                match (change, conf.as_mut()) {
                    (Change::Bump, Some(c)) => c.version += 1,
                    (Change::Older, Some(c)) => c.version = c.version.saturating_sub(1).max(1),
                    (Change::Limit(l), Some(c)) => c.limit = *l,
                    (Change::EndsAt(d), Some(c)) => c.ends_in_days = *d,
                    (Change::Hours(h), Some(c)) => c.hours = *h,
                    (Change::Segments(s), Some(c)) => c.segments = *s,
                    (Change::Remove, _) => *conf = None,
                    (Change::ReAdd, None) => {
                        let other = state.conf[1 - inst][act].clone();
                        state.conf[inst][act] = Some(other.unwrap_or_else(|| ActConf::first(act)));
                    }
                    _ => {}
                }
                state.refused[inst] = [false; 2];
            }
            Op::Sync { inst } => {
                state.conf[inst] = state.conf[1 - inst].clone();
                state.refused[inst] = [false; 2];
            }
            Op::RestartRedis => state.replid += 1,
            Op::Damage { lost } => {
                state.acts[0].damaged = Some(lost);
                if lost == Lost::Res {
                    state.acts[0].life = 0;
                }
            }
            Op::Forget { how } => state.forget(how),
            Op::Snapshot => {
                let res = (0..state.res.len())
                    .filter(|&r| state.res[r].act == 0)
                    .map(|r| (r, state.res[r].clone()))
                    .collect();
                state.snapshot = Some(Box::new((state.acts[0].clone(), res)));
            }
            Op::Resume { inst } => state.expect = state.resume(inst),
            Op::Recount { inst, remaining } => state.expect = state.recount(inst, remaining),
            Op::Expire { act } => {
                // Every key expires but the floor.
                let floor = state.acts[act].floor;
                state.acts[act] = ActModel {
                    floor,
                    ..ActModel::default()
                };
                for res in state.res.iter_mut().filter(|r| r.act == act) {
                    res.gone = true;
                }
            }
        }
        state
    }
}

impl Model {
    /// The activities an operation may change (the invariants are checked on those).
    fn touched_by(&self, op: &Op) -> [bool; 2] {
        let one = |act: usize| [act == 0, act == 1];
        match *op {
            Op::Reserve { act, .. }
            | Op::Batch { act, .. }
            | Op::LateReserve { act, .. }
            | Op::Reconfigure { act, .. }
            | Op::Expire { act } => one(act),
            Op::Damage { .. }
            | Op::Forget { .. }
            | Op::Snapshot
            | Op::Resume { .. }
            | Op::Recount { .. } => one(0),
            Op::Fail { handle }
            | Op::UpstreamOk { handle }
            | Op::LostReply { handle }
            | Op::TimedOut { handle } => one(self.res[self.handles[handle].res].act),
            Op::LookupAnswer { lookup, .. } => one(self.res[self.lookups[lookup].res].act),
            Op::AdminConfirm { res, .. }
            | Op::AdminRelease { res, .. }
            | Op::HoldRunsOut { res } => one(self.res[res].act),
            Op::Sweep { .. }
            | Op::HandOut { .. }
            | Op::Prewarm { .. }
            | Op::Sync { .. }
            | Op::RestartRedis => [true; 2],
        }
    }

    /// The answer to a forward arrives (or its trip ends): it is no longer out.
    fn close(&mut self, handle: usize) -> Handle {
        self.handles[handle].open = false;
        self.handles[handle].clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The system under test: real processes, the gateway's own code.

/// What every case shares: a durable redis-server and the demo upstream (its order lookup
/// answers as told), and a runtime to drive the async code.
struct World {
    redis: Mutex<RedisServer>,
    /// One connection for the test's own reads, made again after a restart.
    conn: Mutex<Option<redis::Connection>>,
    redis_url: String,
    upstream: Upstream,
    runtime: tokio::runtime::Runtime,
}

/// Sequences run and steps applied in this process (`scripts/reliability integrity` reports them).
static SEQUENCES: AtomicU64 = AtomicU64::new(0);
static STEPS: AtomicU64 = AtomicU64::new(0);
/// Purchases that went to Redis together with others (in a batch of two or more).
static BATCHED: AtomicU64 = AtomicU64::new(0);

static WORLD: LazyLock<World> = LazyLock::new(|| {
    // The gateway's own log lines, shown with a failing sequence (RUST_LOG to see more).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
    // Statics are never dropped: both are killed when the test process exits.
    let redis = RedisServer::start_durable().reaped_at_exit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis_url = redis.url();
    World {
        redis: Mutex::new(redis),
        conn: Mutex::new(None),
        redis_url,
        upstream: Upstream::start().reaped_at_exit(),
        runtime,
    }
});

/// Runs `f` on the test's own connection to Redis.
fn with_conn<T>(f: impl FnOnce(&mut redis::Connection) -> T) -> T {
    let w = &*WORLD;
    let mut conn = w.conn.lock().unwrap();
    let conn = conn.get_or_insert_with(|| w.redis.lock().unwrap().conn());
    f(conn)
}

fn yaml(conf: &Conf, lookup: bool) -> String {
    let w = &*WORLD;
    let mut y = format!(
        r#"server: {{ listen: "127.0.0.1:1" }}
admin: {{ listen: "127.0.0.1:2" }}
upstream:
  addresses: ["{upstream}"]
{lookup}redis: {{ url: "{redis}", timeout_ms: 5000 }}
identity: {{ header: X-User-Id }}
signing: {{ header: X-Flashgate-Reservation, algorithm: HS256, key_id: k, secret_env: SECRET, ttl_secs: 900 }}
sold_out_cache: {{ ttl_ms: 3600000 }}
sale_routes:
  - {{ method: POST, path: "/buy/{{activity}}" }}
activities:
"#,
        upstream = w.upstream.addr,
        redis = w.redis_url,
        lookup = if lookup {
            "  order_lookup: { path: \"/orders/{jti}\", timeout_ms: 2000, retry_interval_ms: 3600000 }\n"
        } else {
            ""
        },
    );
    for (a, c) in conf.iter().enumerate() {
        let Some(c) = c else { continue };
        let now = chrono::Utc::now();
        let (starts, ends) = match c.hours {
            Hours::Open => (
                chrono::DateTime::UNIX_EPOCH + chrono::Duration::days(18_262),
                now + chrono::Duration::days(c.ends_in_days),
            ),
            Hours::NotStarted => (
                now + chrono::Duration::hours(12),
                now + chrono::Duration::days(c.ends_in_days),
            ),
            Hours::Ended => (
                chrono::DateTime::UNIX_EPOCH + chrono::Duration::days(18_262),
                now - chrono::Duration::hours(1),
            ),
        };
        y.push_str(&format!(
            "  - {{ id: {}, stock: {}, version: {}, per_user_limit: {}, max_per_request: {}, starts_at: \"{}\", ends_at: \"{}\", hold_secs: 900, segments: {} }}\n",
            ACTS[a].0,
            ACTS[a].1,
            c.version,
            c.limit,
            c.max_per_request(),
            starts.format("%Y-%m-%dT%H:%M:%SZ"),
            ends.format("%Y-%m-%dT%H:%M:%SZ"),
            c.segments
        ));
    }
    y
}

fn settings(conf: &Conf, lookup: bool) -> Arc<Settings> {
    let secrets = |name: &str| (name == "SECRET").then(|| "model-secret".to_owned());
    Arc::new(
        Settings::from_yaml(&yaml(conf, lookup), std::path::Path::new("."), &secrets)
            .unwrap_or_else(|e| panic!("{e}\n{}", yaml(conf, lookup))),
    )
}

/// The settings `flashgate reconcile` reads one activity with (its segment count as Redis
/// recorded it), made once per activity and count.
fn reconcile_settings(a: usize, segments: u32) -> Arc<Settings> {
    type Made = Mutex<HashMap<(usize, u32), Arc<Settings>>>;
    static MADE: LazyLock<Made> = LazyLock::new(Default::default);
    MADE.lock()
        .unwrap()
        .entry((a, segments))
        .or_insert_with(|| {
            let conf: Conf = std::array::from_fn(|i| {
                (i == a).then(|| ActConf {
                    segments,
                    ..ActConf::first(a)
                })
            });
            settings(&conf, false)
        })
        .clone()
}

/// The model's configurations on a gateway instance ([`support::pipeline::Instance`]).
impl Instance {
    fn of(conf: &Conf, marks: &SaleView, store: &Arc<StockStore>) -> Instance {
        block_on(Instance::new(settings(conf, false), marks, store))
    }

    /// Activity `a` as this instance's configuration has it.
    fn act(&self, a: usize) -> Arc<flashgate::config::Activity> {
        self.activity(ACTS[a].0)
    }

    /// A reload: the next generation, refusals forgotten (as `Gateway::apply` does).
    fn apply(&self, conf: &Conf) {
        self.publish_conf(conf, false);
        self.lifecycle.reloaded();
    }

    /// The same configuration with or without `upstream.order_lookup`.
    fn publish_conf(&self, conf: &Conf, lookup: bool) {
        self.publish(settings(conf, lookup));
    }
}

/// A request that got a reservation: what the proxy keeps in its context.
struct HandleSut {
    reservation: Reservation,
    activity: Arc<flashgate::config::Activity>,
}

struct System {
    /// Sequences run one at a time (they share the Redis).
    _serial: std::sync::MutexGuard<'static, ()>,
    /// The stock store both instances speak through, made afresh for each sequence (it
    /// remembers what it saw on sale: a sequence starting from an emptied Redis with the
    /// last one's store would be refused, as a gateway that saw the store forget is).
    store: Arc<StockStore>,
    /// A third gateway that only checks the split activity's masters (see `Op::RestartRedis`).
    checker: StockStore,
    /// The unsegmented activity's keys as `Op::Snapshot` dumped them: (key, DUMP, PTTL).
    snapshot: Vec<(String, Vec<u8>, i64)>,
    instances: Vec<Instance>,
    /// Reservation ids, in the model's order.
    jtis: Vec<String>,
    handles: Vec<HandleSut>,
    /// Lookups handed out, in the model's order.
    lookups: Vec<HandedOut>,
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    WORLD.runtime.block_on(f)
}

impl System {
    fn reserve(
        &mut self,
        inst: usize,
        act: usize,
        user: usize,
        qty: u64,
        key: Option<u8>,
        id: Option<&str>,
    ) -> (&'static str, Option<Reservation>) {
        block_on(purchase(&self.instances[inst], act, user, qty, key, id))
    }

    /// Purchases on one instance, each started before any is answered: they reach the reserve
    /// in list order and go in one script call (the store holds reserves until all are in).
    fn batch(
        &mut self,
        inst: usize,
        act: usize,
        items: &[(usize, u64, Option<u8>)],
    ) -> Vec<(&'static str, Option<Reservation>)> {
        let store = &self.store;
        let instance = &self.instances[inst];
        let done = AtomicU64::new(0);
        let purchases = items.iter().map(|&(user, qty, key)| {
            let done = &done;
            async move {
                let answer = purchase(instance, act, user, qty, key, None).await;
                done.fetch_add(1, Ordering::SeqCst);
                answer
            }
        });
        store.hold_reserves();
        let release = async {
            // Every purchase is answered at once (refused before the store) or waits in the
            // held call: nothing on their way waits on Redis.
            for _ in 0..1000 {
                if store.reserves_waiting() as u64 + done.load(Ordering::SeqCst)
                    == items.len() as u64
                {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(
                store.reserves_waiting() as u64 + done.load(Ordering::SeqCst),
                items.len() as u64,
                "every purchase reached the held reserve or was answered"
            );
            let held = store.reserves_waiting() as u64;
            if held > 1 {
                BATCHED.fetch_add(held, Ordering::Relaxed);
            }
            store.release_reserves();
        };
        block_on(futures_util::future::join(
            futures_util::future::join_all(purchases),
            release,
        ))
        .0
    }

    /// Checks one purchase's answer against the model's expectation, and keeps what it made.
    fn check_purchase(
        &mut self,
        inst: usize,
        act: usize,
        (code, reservation): (&'static str, Option<Reservation>),
        expect: &Expect,
        op: &Op,
    ) {
        let sys = self;
        let Expect::Decision(want, made) = expect else {
            unreachable!()
        };
        assert_eq!(code, *want, "{op:?}");
        if let (Some(r), Some((res, replayed))) = (reservation, made) {
            assert_eq!(r.owned, !replayed, "{op:?}: owned");
            if *replayed {
                assert_eq!(r.id, sys.jtis[*res], "a replay returns the same jti");
            } else {
                assert_eq!(*res, sys.jtis.len());
                sys.jtis.push(r.id.clone());
            }
            let activity = sys.instances[inst]
                .live
                .current()
                .settings
                .activities
                .get(ACTS[act].0)
                .unwrap()
                .clone();
            sys.handles.push(HandleSut {
                reservation: r,
                activity,
            });
        }
    }

    /// Redis forgets the unsegmented activity's keys (`Forget`).
    fn forget(&mut self, how: Forget) {
        match how {
            Forget::Emptied => {
                let keys = keys_of(0);
                if !keys.is_empty() {
                    with_conn(|conn| redis::cmd("DEL").arg(keys).query::<()>(conn).unwrap());
                }
            }
            Forget::Older => {
                let keys = keys_of(0);
                with_conn(|conn| {
                    if !keys.is_empty() {
                        redis::cmd("DEL").arg(keys).query::<()>(conn).unwrap();
                    }
                    for (key, dump, pttl) in &self.snapshot {
                        redis::cmd("RESTORE")
                            .arg(key)
                            .arg((*pttl).max(0))
                            .arg(dump.as_slice())
                            .query::<()>(conn)
                            .unwrap();
                    }
                });
            }
            Forget::Evicted(lost) => {
                let key = match lost {
                    Lost::Users => "fg:{plain}:users",
                    Lost::Res => "fg:{plain}:res",
                };
                with_conn(|conn| redis::cmd("DEL").arg(key).query::<()>(conn).unwrap());
            }
        }
    }

    fn segment_of<'l>(layout: &'l Layout, id: &str) -> flashgate::stock::Segment<'l> {
        layout
            .segment(Reservation::segment_of(id).unwrap())
            .unwrap()
    }
}

/// One purchase on `instance`, through the gateway's pipeline (with `id`, the reservation id
/// an abandon used first).
async fn purchase(
    instance: &Instance,
    act: usize,
    user: usize,
    qty: u64,
    key: Option<u8>,
    id: Option<&str>,
) -> (&'static str, Option<Reservation>) {
    let key = key.map(|k| format!("key-{k}"));
    pipeline::purchase(instance, ACTS[act].0, USERS[user], qty, key.as_deref(), id).await
}

/// Every key of one activity (all its segments).
fn keys_of(act: usize) -> Vec<String> {
    let pattern = format!("fg:{{{}*", ACTS[act].0);
    with_conn(|conn| redis::cmd("KEYS").arg(pattern).query(conn).unwrap())
}

/// The steps of `apply` with more than a call or two, one per operation.
impl System {
    /// A reserve whose abandon landed first: the abandon, then the reserve, and its answer checked.
    fn late_reserve(&mut self, model: &Model, op: &Op, inst: usize, act: usize, user: usize) {
        // The abandon lands first: a tombstone under a fresh id, in the buyer's home.
        let generation = self.instances[inst].live.current();
        let code = match generation.settings.activities.get(ACTS[act].0) {
            Some(activity) => {
                let layout = Layout::of(activity);
                let home = layout.home(USERS[user]);
                let id = Reservation::id_in_segment(activity, home.index());
                block_on(self.instances[inst].lifecycle.release(
                    home,
                    activity.version,
                    &id,
                    ReleaseMode::Abandon,
                    ReleaseReason::StoreTimeout,
                ))
                .unwrap();
                self.reserve(inst, act, user, 1, None, Some(&id)).0
            }
            None => "unknown_activity",
        };
        let Expect::Decision(want, _) = &model.expect else {
            unreachable!()
        };
        assert_eq!(code, *want, "{op:?}");
    }

    /// A reserve whose reply was lost: admission abandons the id it made.
    fn lost_reply(&self, handle: usize) {
        // Admission abandons the id this request made (for a replay: one never used).
        let h = &self.handles[handle];
        let layout = Layout::of(&h.activity);
        let segment = layout.segment(h.reservation.segment).unwrap();
        let id = if h.reservation.owned {
            h.reservation.id.clone()
        } else {
            Reservation::id_in_segment(&h.activity, h.reservation.segment)
        };
        block_on(self.instances[0].lifecycle.release(
            segment,
            h.activity.version,
            &id,
            ReleaseMode::Abandon,
            ReleaseReason::StoreTimeout,
        ))
        .unwrap();
    }

    /// An admin confirm or release of a reservation by id, its answer checked.
    fn admin_call(&self, model: &Model, op: &Op, inst: usize, res: usize) {
        let generation = self.instances[inst].live.current();
        let lifecycle = &self.instances[inst].lifecycle;
        let answer = match generation
            .settings
            .activities
            .get(ACTS[model.res[res].act].0)
        {
            None => "not_found",
            Some(activity) => {
                let jti = &self.jtis[res];
                let outcome = if matches!(op, Op::AdminConfirm { .. }) {
                    block_on(lifecycle.confirm_by_id(activity, jti))
                } else {
                    block_on(lifecycle.release_by_id(activity, jti))
                };
                match outcome.unwrap() {
                    AdminOutcome::Done(_) => "done",
                    AdminOutcome::Conflict(_) => "conflict",
                    AdminOutcome::NotFound => "not_found",
                }
            }
        };
        assert_eq!(Expect::Admin(answer), model.expect, "{op:?}");
    }

    /// A pending reservation's hold runs out: its deadline and due time moved into the past.
    fn hold_runs_out(&self, model: &Model, res: usize) {
        let r = &model.res[res];
        if !r.gone && r.state == St::Pending {
            let layout = Layout::new(
                Arc::from(ACTS[r.act].0),
                model.acts[r.act].segments.unwrap(),
            );
            let segment = System::segment_of(&layout, &self.jtis[res]);
            let keys = self.store.keys().of(segment);
            let jti = &self.jtis[res];
            with_conn(|conn| {
                // Its deadline and every forward's trip end (in the record), and its
                // due time (in the pending set): time passed beyond them all.
                let raw: String = redis::cmd("HGET")
                    .arg(keys.reservations())
                    .arg(jti)
                    .query(conn)
                    .unwrap();
                // state|qty|ver|created|deadline|done|reason|flags|fence|prior|busy|user
                let mut fields: Vec<&str> = raw.splitn(12, '|').collect();
                fields[4] = "1";
                fields[9] = "0";
                fields[10] = "0";
                redis::cmd("HSET")
                    .arg(keys.reservations())
                    .arg(jti)
                    .arg(fields.join("|"))
                    .query::<()>(conn)
                    .unwrap();
                redis::cmd("ZADD")
                    .arg(keys.pending(r.version))
                    .arg("XX")
                    .arg(0)
                    .arg(jti)
                    .query::<()>(conn)
                    .unwrap()
            });
        }
    }

    /// Redis restarts durably; the fences of layouts the model does not follow are lifted.
    fn restart_redis(&self, model: &Model) {
        let w = &*WORLD;
        // The layouts whose fence the model does not follow (the split activity's, and
        // the unsegmented one's when reconfigured to segments) were accepted under the master at their making
        // (lua/prewarm.lua): a gateway's check before the restart recorded its
        // persistence, and one after the settle window (none here, see `init_test`)
        // lifts the fence by the durable_restart rule: a third gateway's, whose memory
        // the model does not follow. (The unsegmented activity's one segment's fence is the
        // model's: it stands until an operator's resume.)
        let segmented: Vec<Arc<Settings>> = (0..2)
            .filter_map(|a| {
                let act = &model.acts[a];
                let (segments, version) = act.segments.zip(act.current)?;
                (a == 1 || segments > 1).then(|| {
                    let mut conf: Conf = [None, None];
                    conf[a] = Some(ActConf {
                        segments,
                        version,
                        ..ActConf::first(a)
                    });
                    settings(&conf, false)
                })
            })
            .collect();
        let layouts = || {
            segmented
                .iter()
                .flat_map(|s| s.activities.iter().cloned().collect::<Vec<_>>())
        };
        for activity in layouts() {
            block_on(self.checker.check_master(&activity)).unwrap();
        }
        w.redis.lock().unwrap().restart();
        *w.conn.lock().unwrap() = None;
        block_on(wait_for_async(
            "the store to answer again",
            Duration::from_secs(20),
            || async { self.store.ready().await.ok() },
        ));
        for activity in layouts() {
            let checked = block_on(self.checker.check_master(&activity)).unwrap();
            assert!(
                checked.fence.is_none(),
                "a durable restart is lifted: {checked:?}"
            );
        }
    }

    /// A snapshot of the unsegmented activity's keys (DUMP and PTTL), for `Forget::Older`.
    fn snapshot(&mut self) {
        let keys = keys_of(0);
        self.snapshot = with_conn(|conn| {
            keys.into_iter()
                .map(|key| {
                    let (dump, pttl): (Vec<u8>, i64) = redis::pipe()
                        .cmd("DUMP")
                        .arg(&key)
                        .cmd("PTTL")
                        .arg(&key)
                        .query(conn)
                        .unwrap();
                    (key, dump, pttl)
                })
                .collect()
        });
    }

    /// The runbook's resume on `inst`, its answer checked.
    fn resume(&self, model: &Model, op: &Op, inst: usize) {
        // The runbook's resume: `reconcile --orders` found the backend's orders whole
        // (recorded in Redis), then the plain resume.
        let activity = self.instances[inst].act(0);
        block_on(self.store.orders_checked(&activity)).unwrap();
        let answer = match block_on(self.store.accept_master(&activity)).unwrap() {
            flashgate::stock::failover::Resumed::Accepted => "ok",
            flashgate::stock::failover::Resumed::Lost(_) => "lost",
            flashgate::stock::failover::Resumed::Unchecked(_) => "unchecked",
        };
        assert_eq!(Expect::Admin(answer), model.expect, "{op:?}");
    }

    /// An operator's recount on `inst`, its answer checked.
    fn recount(&self, model: &Model, op: &Op, inst: usize, remaining: u64) {
        let activity = self.instances[inst].act(0);
        let answer = match block_on(self.instances[inst].lifecycle.recount(&activity, remaining)) {
            Ok(_) => "ok",
            Err(
                segments::RecountError::Refused(_) | segments::RecountError::OtherVersion { .. },
            ) => "refused",
            Err(segments::RecountError::HeldStill { .. }) => "held",
            Err(e) => panic!("{op:?}: {e}"),
        };
        assert_eq!(Expect::Admin(answer), model.expect, "{op:?}");
    }

    /// The activity's keys expire: every key but its floor goes.
    fn expire(&self, act: usize) {
        // Every key with an expiry goes; every key but the activity's floor has one.
        let mut expiring = Vec::new();
        for key in keys_of(act) {
            let ttl: i64 = with_conn(|conn| redis::cmd("TTL").arg(&key).query(conn).unwrap());
            if ttl == -1 {
                assert!(key.ends_with(":floor"), "{key} never expires");
            } else {
                expiring.push(key);
            }
        }
        if !expiring.is_empty() {
            with_conn(|conn| redis::cmd("DEL").arg(expiring).query::<()>(conn).unwrap());
        }
    }
}

impl StateMachineTest for System {
    type SystemUnderTest = System;
    type Reference = Model;

    fn init_test(model: &Model) -> System {
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let w = &*WORLD;
        let store = Arc::new(stock_store(
            w.redis_url.clone(),
            vec![],
            Duration::from_secs(5),
        ));
        // Another test's sequence may have restarted Redis since this thread's connection was
        // made: make sure it answers before the sequence starts.
        block_on(wait_for_async(
            "the store to answer",
            Duration::from_secs(20),
            || async { store.ready().await.ok() },
        ));
        with_conn(|conn| redis::cmd("FLUSHALL").query::<()>(conn).unwrap());
        block_on(w.upstream.reset());
        let (marks, _) = SaleState::new();
        System {
            _serial: serial,
            // A fence's settle window passes with one check (the time a sequence does not take).
            checker: stock_store(w.redis_url.clone(), vec![], Duration::from_secs(5))
                .with_fence_settle(Duration::ZERO),
            instances: model
                .conf
                .iter()
                .map(|c| Instance::of(c, &marks, &store))
                .collect(),
            store,
            snapshot: Vec::new(),
            jtis: Vec::new(),
            handles: Vec::new(),
            lookups: Vec::new(),
        }
    }

    fn apply(mut sys: System, model: &Model, op: Op) -> System {
        STEPS.fetch_add(1, Ordering::Relaxed);
        match op {
            Op::Reserve {
                inst,
                act,
                user,
                qty,
                key,
            } => {
                let answer = sys.reserve(inst, act, user, qty, key, None);
                sys.check_purchase(inst, act, answer, &model.expect, &op);
            }
            Op::Batch {
                inst,
                act,
                ref items,
            } => {
                let answers = sys.batch(inst, act, items);
                let Expect::Batch(expects) = &model.expect else {
                    unreachable!()
                };
                assert_eq!(answers.len(), expects.len());
                for (answer, expect) in answers.into_iter().zip(expects) {
                    sys.check_purchase(inst, act, answer, expect, &op);
                }
            }
            Op::LateReserve { inst, act, user } => {
                sys.late_reserve(model, &op, inst, act, user);
            }
            Op::Fail { handle } => {
                let h = &sys.handles[handle];
                block_on(sys.instances[0].lifecycle.release_failed(
                    &h.activity,
                    &h.reservation,
                    ReleaseReason::Upstream5xx,
                ))
                .unwrap();
            }
            Op::UpstreamOk { handle } => {
                let h = &sys.handles[handle];
                let layout = Layout::of(&h.activity);
                let segment = layout.segment(h.reservation.segment).unwrap();
                block_on(sys.instances[0].lifecycle.confirm(
                    segment,
                    h.reservation.version,
                    &[h.reservation.id.as_str()],
                    ConfirmedVia::Upstream,
                ))
                .unwrap();
            }
            Op::LostReply { handle } => {
                sys.lost_reply(handle);
            }
            Op::AdminConfirm { inst, res } | Op::AdminRelease { inst, res } => {
                sys.admin_call(model, &op, inst, res);
            }
            Op::HoldRunsOut { res } => {
                sys.hold_runs_out(model, res);
            }
            Op::TimedOut { handle } => {
                // The gateway's settle_soon, with no wait: due at once where the fence allows.
                let h = &sys.handles[handle];
                block_on(sys.instances[0].lifecycle.due_soon(
                    &h.activity,
                    &h.reservation,
                    Duration::ZERO,
                ))
                .unwrap();
            }
            Op::Sweep { inst } => {
                let instance = &sys.instances[inst];
                instance.publish_conf(&model.conf[inst], false);
                block_on(instance.lifecycle.sweep_expired());
            }
            Op::HandOut { inst } => {
                // The sweep's first half, with an order lookup configured; nobody asked yet.
                let instance = &sys.instances[inst];
                let conf = &model.conf[inst];
                instance.publish_conf(conf, true);
                let mut handed = block_on(instance.lifecycle.hand_out());
                instance.publish_conf(conf, false);
                handed.sort_by_key(|h| sys.jtis.iter().position(|j| *j == h.leased.id));
                sys.lookups.extend(handed);
                assert_eq!(sys.lookups.len(), model.lookups.len(), "handed out");
            }
            Op::LookupAnswer { lookup, answer } => {
                let h = &sys.lookups[lookup];
                let segment = h.layout.segment(h.segment).unwrap();
                let answer = match answer {
                    Lookup::Found => flashgate::upstream::lookup::Answer::Found,
                    Lookup::NotFound => flashgate::upstream::lookup::Answer::NotFound,
                    Lookup::Unanswered => flashgate::upstream::lookup::Answer::Unanswered,
                };
                block_on(
                    sys.instances[0]
                        .lifecycle
                        .settle_answer(segment, h.version, &h.leased, answer),
                );
            }
            Op::Prewarm { inst } => {
                let instance = &sys.instances[inst];
                let settings = instance.live.settings();
                for activity in settings.activities.iter() {
                    // As the maintenance tick does: a sale that is over is left alone.
                    if activity.ends_at <= chrono::Utc::now() {
                        continue;
                    }
                    match block_on(segments::prewarm(&sys.store, activity)).unwrap() {
                        Ok(_) => instance.lifecycle.refused(&activity.id, None),
                        Err(refusal) => instance.lifecycle.refused(&activity.id, Some(refusal)),
                    }
                }
            }
            Op::Reconfigure { inst, .. } | Op::Sync { inst } => {
                sys.instances[inst].apply(&model.conf[inst]);
            }
            Op::RestartRedis => {
                sys.restart_redis(model);
            }
            Op::Damage { lost } => {
                let key = match lost {
                    Lost::Users => "fg:{plain}:users",
                    Lost::Res => "fg:{plain}:res",
                };
                with_conn(|conn| {
                    redis::cmd("HDEL")
                        .arg(key)
                        .arg("")
                        .query::<()>(conn)
                        .unwrap()
                });
            }
            Op::Forget { how } => sys.forget(how),
            Op::Snapshot => {
                sys.snapshot();
            }
            Op::Resume { inst } => {
                sys.resume(model, &op, inst);
            }
            Op::Recount { inst, remaining } => {
                sys.recount(model, &op, inst, remaining);
            }
            Op::Expire { act } => {
                sys.expire(act);
            }
        }
        sys
    }

    fn teardown(_sys: System) {
        let sequences = SEQUENCES.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(path) = std::env::var("FLASHGATE_INTEGRITY_REPORT") {
            let steps = STEPS.load(Ordering::Relaxed);
            let batched = BATCHED.load(Ordering::Relaxed);
            let _ = std::fs::write(
                path,
                format!("sequences {sequences} steps {steps} batched {batched}\n"),
            );
        }
    }

    fn check_invariants(sys: &System, model: &Model) {
        // Never more units a buyer's than the version's stock, whatever Redis forgot.
        for ((a, v), out) in &model.out {
            assert!(
                *out <= Model::stock(*a),
                "sold twice: {out} units of {} v{v} are buyers', of {}",
                ACTS[*a].0,
                Model::stock(*a)
            );
        }
        for (a, act) in model.acts.iter().enumerate() {
            let Some(segments) = act.segments.filter(|_| model.touched[a]) else {
                continue;
            };
            // `flashgate reconcile`: every ledger balanced and agreeing with the records, and
            // clean exactly when the backend never accepted a released reservation.
            let report = block_on(flashgate::reconcile::reconcile(
                &reconcile_settings(a, segments),
                &sys.store,
                Some(ACTS[a].0),
            ))
            .unwrap();
            let late = act.versions.values().any(|v| v.late > 0);
            // A segment marked lost is never clean (reconcile names it), until recounted; a
            // mark a newer version on sale left behind (a stale configuration's resume marked
            // its own layout) is not the recorded layout's to name.
            let lost = a == 0 && model.lost_stands() || a != 0 && act.lost.is_some();
            let forgot = act.forgot_records;
            // A hash that lost its placeholder is named (DAMAGED) until a recount.
            let damaged = act.damaged.is_some();
            assert_eq!(
                report.clean(),
                !late && !lost && !forgot && !damaged,
                "{}",
                report.table()
            );
            assert_eq!(
                report.forgotten.iter().any(|f| f.what.starts_with("LOST")),
                lost,
                "{}",
                report.table()
            );
            assert!(
                report
                    .versions
                    .iter()
                    .all(|v| v.ledger.drift() == 0 && (forgot || v.records_agree()))
                    && report.transfer_mismatches.is_empty(),
                "{}",
                report.table()
            );
            assert_eq!(
                report.versions.iter().all(|v| v.records_agree()),
                !forgot,
                "{}",
                report.table()
            );
            let layout = Layout::new(Arc::from(ACTS[a].0), segments);
            let mut records: HashMap<String, String> = HashMap::new();
            let mut held: HashMap<String, u64> = HashMap::new();
            let mut events: HashMap<String, Vec<String>> = HashMap::new();
            with_conn(|conn| {
                for segment in layout.segments() {
                    let keys = sys.store.keys().of(segment);
                    for (jti, kind) in reservation_events(conn, &keys.events()) {
                        events.entry(jti).or_default().push(kind);
                    }
                    let (res, users): (HashMap<String, String>, HashMap<String, String>) =
                        redis::pipe()
                            .cmd("HGETALL")
                            .arg(keys.reservations())
                            .cmd("HGETALL")
                            .arg(keys.users())
                            .query(conn)
                            .unwrap();
                    records.extend(res.into_iter().filter(|(k, _)| !k.is_empty()));
                    for (u, n) in users.into_iter().filter(|(k, _)| !k.is_empty()) {
                        *held.entry(u).or_default() += n.parse::<u64>().unwrap();
                    }
                }
            });
            // Every reservation is where the model says; states only moved forward.
            for (r, res) in model
                .res
                .iter()
                .enumerate()
                .filter(|(_, r)| r.act == a && !r.gone)
            {
                let raw = records
                    .get(&sys.jtis[r])
                    .unwrap_or_else(|| panic!("reservation {r} has no record"));
                let record = flashgate::stock::ReservationRecord::parse(raw).unwrap();
                let want = match res.state {
                    St::Pending => flashgate::stock::RecordState::Pending,
                    St::Confirmed => flashgate::stock::RecordState::Confirmed,
                    St::Released => flashgate::stock::RecordState::Released,
                };
                assert_eq!(record.state, want, "reservation {r}: {res:?} vs {raw}");
                assert_eq!((record.qty, record.ver), (res.qty, res.version), "{raw}");
                assert_eq!(record.replayed, res.claimed, "reservation {r}: {raw}");
            }
            check_events(sys, model, a, &events);
            // Every user's units, across versions and segments.
            for (u, user) in USERS.iter().enumerate() {
                let want = act.held.get(&u).copied().unwrap_or(0);
                let got = held.get(*user).copied().unwrap_or(0);
                assert_eq!(got, want, "{} units of {user}", ACTS[a].0);
            }
            // Each version's stock as the model says, and never oversold.
            for (v, version) in &act.versions {
                let rows: Vec<_> = report
                    .versions
                    .iter()
                    .filter(|r| r.ledger.version == *v)
                    .map(|r| r.ledger)
                    .collect();
                let sold: i64 = rows.iter().map(|r| r.pending + r.confirmed).sum();
                let held_units: u64 = model
                    .res
                    .iter()
                    .filter(|r| r.act == a && !r.gone && r.version == *v)
                    .filter(|r| r.state != St::Released)
                    .map(|r| r.qty)
                    .sum::<u64>()
                    + version.covered
                    + version.unrecorded;
                assert_eq!(sold as u64, held_units, "{} v{v} sold", ACTS[a].0);
                assert!(held_units <= version.initial, "{} v{v} oversold", ACTS[a].0);
                let late: i64 = rows.iter().map(|r| r.late_accepted).sum();
                let oversold: i64 = rows.iter().map(|r| r.oversold).sum();
                assert_eq!(
                    (late as u64, oversold as u64),
                    (version.late, version.oversold),
                    "{} v{v} accepted late, oversold",
                    ACTS[a].0
                );
                if act.current == Some(*v) {
                    let left: i64 = rows
                        .iter()
                        .map(|r| if r.stock_key { r.remaining } else { 0 })
                        .sum();
                    assert_eq!(left as u64, version.left, "{} v{v} left", ACTS[a].0);
                }
            }
        }
    }
}

/// The event stream is complete and in order per reservation: every reservation Redis still
/// holds has exactly one `reserve` event, then a `confirm` once confirmed, then a `release`
/// once released (a confirmed sale too, by an explicit call), nothing else; and every
/// reservation event names a reservation that was made (no event of a purchase that did not
/// land). (Only the model's operations remove a stream: with every key of the activity, its
/// records too, or back to a snapshot taken with them.)
fn check_events(sys: &System, model: &Model, a: usize, events: &HashMap<String, Vec<String>>) {
    let made: HashMap<&String, usize> = model
        .res
        .iter()
        .enumerate()
        .filter(|(_, r)| r.act == a)
        .map(|(r, _)| (&sys.jtis[r], r))
        .collect();
    for jti in events.keys() {
        assert!(made.contains_key(jti), "an event of {jti}, never made");
    }
    for (r, res) in model
        .res
        .iter()
        .enumerate()
        .filter(|(_, r)| r.act == a && !r.gone)
    {
        let got: Vec<&str> = events
            .get(&sys.jtis[r])
            .map(|e| e.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let fits = match res.state {
            St::Pending => got == ["reserve"],
            St::Confirmed => got == ["reserve", "confirm"],
            St::Released => {
                got == ["reserve", "release"] || got == ["reserve", "confirm", "release"]
            }
        };
        assert!(fits, "reservation {r} ({res:?}): events {got:?}");
    }
}

prop_state_machine! {
    #![proptest_config(support::generated::sequences(300, 4096))]

    #[test]
    fn the_lifecycle_keeps_every_invariant(sequential 1..40 => System);
}

/// Runs one fixed sequence through the model and the system, checking as the generated ones do.
fn replay(transitions: Vec<Op>) {
    System::test_sequential(Config::default(), Model::initial(), transitions, None);
}

/// Found by the generator: once an activity's keys expired with its retention, the activity
/// registry still held its old segment count and refused a new one: a registry record whose
/// segments hold nothing is stale. (Issue 20 changed the rule: the activity sells afresh only
/// under a new version; under its old one it is refused, whatever the segment count.)
#[test]
fn regression_an_expired_activity_sells_afresh_only_under_a_new_version() {
    for segments in [2, 3] {
        let reconfigure = |change| Op::Reconfigure {
            inst: 1,
            act: 0,
            change,
        };
        replay(vec![
            reserve(0, 0, 0, None),
            Op::Expire { act: 0 },
            reconfigure(Change::Segments(segments)),
            // Refused: the version was on sale before its keys expired.
            reserve(1, 0, 0, None),
            reconfigure(Change::Bump),
            Op::LateReserve {
                inst: 1,
                act: 0,
                user: 0,
            },
            reserve(1, 0, 0, None),
        ]);
    }
}

/// A purchase by `user` of one unit of `act` on instance `inst`.
fn reserve(inst: usize, act: usize, user: usize, key: Option<u8>) -> Op {
    Op::Reserve {
        inst,
        act,
        user,
        qty: 1,
        key,
    }
}

/// Found by the interleaving generator on the scripts before issue 20 (shrunk): a sale whose
/// keys expired was sold afresh under its old version (here the sale is simply asked again; in
/// production an SRE moved `ends_at` forward once the retention had passed). Every unit sold
/// again, and `reconcile` saw nothing: the ledger was new. The version floor, which never
/// expires, refuses it.
#[test]
fn regression_a_version_whose_keys_expired_never_sells_again() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Expire { act: 0 },
        reserve(0, 0, 0, None),
    ]);
}

/// Found by the interleaving generator on the scripts before issue 20 (shrunk): a keyed purchase
/// timed out at the backend (due for its order lookup soon), a sweep handed it out, the buyer
/// retried with the same key (replayed, forwarded again), and the lookup's "not found", asked
/// before that retry reached the backend, released it: the retry's order then sold the unit a
/// second time. The hand-out records the fence, the replay moves it, and the stale answer is
/// discarded.
#[test]
fn regression_a_lookup_answer_older_than_a_replay_releases_nothing() {
    replay(vec![
        reserve(0, 0, 1, Some(1)),
        reserve(0, 0, 0, None),
        reserve(0, 0, 0, None),
        reserve(0, 1, 2, Some(1)),
        Op::TimedOut { handle: 3 },
        Op::HandOut { inst: 0 },
        reserve(0, 1, 2, Some(1)),
        Op::LookupAnswer {
            lookup: 0,
            answer: Lookup::NotFound,
        },
        Op::UpstreamOk { handle: 4 },
    ]);
}

/// Found by the generator after issue 22's restructuring (shrunk to this): the same race across
/// a version bump. A keyed purchase timed out at the backend (due soon for its order lookup); the
/// buyer's retry reached a gateway already running the next version, was replayed and forwarded
/// again, but the script moved its due time in the new version's pending set, where it is not: a
/// sweep handed it out while the retry was at the backend, and a "not found" then would have
/// released a unit the retry's order takes. The replay is now asked again with its own
/// version's keys.
#[test]
fn regression_a_replay_under_a_newer_version_moves_its_due_time() {
    replay(vec![
        reserve(0, 0, 2, Some(1)),
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Bump,
        },
        Op::TimedOut { handle: 0 },
        reserve(1, 0, 2, Some(1)),
        Op::HandOut { inst: 0 },
        Op::UpstreamOk { handle: 1 },
    ]);
}

/// The same race without a retry landing inside the lookup (issue 20): a replay is at the
/// backend when the first forward, which timed out, asks for an early lookup. That used to make
/// the reservation due at once (the due time only moved earlier), so a sweep handed it out
/// while the replay was still out. Now a due time never moves before a forward still in flight.
#[test]
fn regression_an_early_lookup_waits_for_a_replay_in_flight() {
    replay(vec![
        reserve(0, 0, 0, Some(0)),
        reserve(1, 0, 0, Some(0)),
        Op::TimedOut { handle: 0 },
        Op::HandOut { inst: 0 },
        Op::UpstreamOk { handle: 1 },
    ]);
}

/// Found by the generator (after review 12b's fixes): an abandon landing after the activity's
/// keys expired wrote its tombstone into a fresh `res` hash, and the registry check counted that
/// segment as still alive, refusing the new segment count. Only what prewarm writes (the meta,
/// the placeholders) keeps a layout alive.
#[test]
fn regression_a_late_abandon_tombstone_does_not_keep_an_expired_layout_alive() {
    replay(vec![
        Op::Reserve {
            inst: 0,
            act: 0,
            user: 0,
            qty: 1,
            key: None,
        },
        Op::Reserve {
            inst: 0,
            act: 0,
            user: 0,
            qty: 1,
            key: None,
        },
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Segments(2),
        },
        Op::Expire { act: 0 },
        Op::LostReply { handle: 0 },
        // A new version (the old one never sells again once its keys expired).
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Bump,
        },
        Op::Reserve {
            inst: 1,
            act: 0,
            user: 0,
            qty: 1,
            key: None,
        },
    ]);
}

/// Found by the generator in issue 33 (shrunk): a recount after the store went back, a sale in
/// the recount's new life, then the store went back again to a snapshot of the life before:
/// the segment held as many records as the gateways saw, but of an older life, and sold the
/// units again. Lives are ordered: an older one is the store gone back.
#[test]
fn regression_a_store_gone_back_to_an_older_life_sells_nothing() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::LostReply { handle: 0 },
        Op::Snapshot,
        Op::Recount {
            inst: 0,
            remaining: 6,
        },
        Op::Batch {
            inst: 0,
            act: 0,
            items: vec![(1, 2, None), (0, 1, None)],
        },
        Op::Forget { how: Forget::Older },
        Op::Snapshot,
        Op::Batch {
            inst: 1,
            act: 0,
            items: vec![(0, 2, None), (1, 2, None)],
        },
    ]);
}

/// Found by the generator in issue 33 (shrunk): an emptied store lost the activity's floor,
/// and a gateway still on the older YAML put the older version on sale, although a newer one
/// had been: the store's memory of the newer version refuses it, and marks the loss.
#[test]
fn regression_an_older_yaml_after_the_floor_was_lost_sells_nothing() {
    replay(vec![
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Bump,
        },
        Op::Prewarm { inst: 1 },
        Op::Forget {
            how: Forget::Emptied,
        },
        reserve(0, 0, 0, None),
        reserve(1, 0, 0, None),
    ]);
}

/// Found by the generator in issue 33 (shrunk): a version put on sale by a recount (never by a
/// prewarm) was not remembered on sale, so an emptied store made it again from the YAML.
#[test]
fn regression_a_version_a_recount_put_on_sale_is_remembered() {
    replay(vec![
        Op::Recount {
            inst: 0,
            remaining: 6,
        },
        Op::Batch {
            inst: 0,
            act: 0,
            items: vec![(0, 1, None), (3, 2, None), (0, 2, None), (2, 2, None)],
        },
        Op::Forget {
            how: Forget::Emptied,
        },
        reserve(0, 0, 0, None),
        reserve(0, 0, 1, None),
    ]);
}

/// Found by the generator in issue 33 (shrunk): a prewarm refused because the version was seen
/// on sale and is gone had already retired the version on sale there (a script's writes are
/// not undone by its refusal); the refusal now comes first.
#[test]
fn regression_a_refused_prewarm_retires_nothing() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Snapshot,
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Bump,
        },
        Op::Expire { act: 0 },
        Op::Recount {
            inst: 1,
            remaining: 6,
        },
        Op::Forget { how: Forget::Older },
        Op::Prewarm { inst: 1 },
    ]);
}

/// Found by the generator in issue 33 (shrunk): a recount refused because another version is
/// on sale had already moved the version floor to the refused version, which then never sold.
#[test]
fn regression_a_refused_recount_moves_no_floor() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Reconfigure {
            inst: 0,
            act: 0,
            change: Change::Bump,
        },
        Op::Recount {
            inst: 0,
            remaining: 6,
        },
        Op::Expire { act: 0 },
        Op::Prewarm { inst: 0 },
    ]);
}

/// Found by the generator in issue 33 (shrunk): a records hash evicted after a sale: the
/// ledgers and the records disagree, and reconcile names the hash, until a recount.
#[test]
fn regression_an_evicted_records_hash_is_named() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Forget {
            how: Forget::Evicted(Lost::Res),
        },
    ]);
}

/// Found by the generator in issue 33 (shrunk): a damaged records hash found lost, a refused
/// plain resume, a recount, then the store emptied: the version the recount put on sale is never
/// made again, and the loss is marked.
#[test]
fn regression_an_emptied_store_after_a_recount_is_marked_lost() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Damage { lost: Lost::Res },
        reserve(1, 0, 0, None),
        Op::Resume { inst: 1 },
        Op::Recount {
            inst: 0,
            remaining: 4,
        },
        Op::Forget {
            how: Forget::Emptied,
        },
        reserve(1, 0, 0, None),
    ]);
}

/// Found by CI in issue 33 (shrunk): a records hash evicted, a recount, then a restart of the
/// store and a plain resume: the recount's count stands and the ledgers stay whole.
#[test]
fn regression_a_recount_after_an_evicted_records_hash_survives_a_restart() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Forget {
            how: Forget::Evicted(Lost::Res),
        },
        Op::Recount {
            inst: 0,
            remaining: 3,
        },
        Op::RestartRedis,
        Op::Resume { inst: 0 },
    ]);
}

/// Found by the generator (seed 4242, shrunk): version 1 sold in one segment and its keys
/// expired; the other gateway's YAML moved to version 2 in three segments and sold; a plain
/// resume on the gateway still configured with version 1 in one segment checks that layout,
/// finds its records gone and answers 409 lost (in doubt, hold), marking the layout Redis no
/// longer records. `flashgate reconcile` reads the recorded one (clean): the model expected
/// the mark named there. Nothing sold twice; the model now keeps the mark to its layout.
#[test]
fn regression_a_stale_resume_marks_a_layout_reconcile_does_not_read() {
    replay(vec![
        Op::Prewarm { inst: 0 },
        Op::Batch {
            inst: 0,
            act: 0,
            items: vec![(0, 1, None), (0, 1, None)],
        },
        Op::Expire { act: 0 },
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Segments(3),
        },
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Bump,
        },
        reserve(1, 0, 0, None),
        Op::Resume { inst: 0 },
    ]);
}

/// Found by the generator (seed 777, shrunk) against the first model of the stale layout's
/// mark: a stale configuration's resume marks the very layout the newer version sells in (the
/// segment count unchanged), and that loss stands for it: reconcile names it.
#[test]
fn regression_a_stale_resume_on_the_same_layout_marks_the_version_on_sale() {
    replay(vec![
        Op::Reconfigure {
            inst: 0,
            act: 0,
            change: Change::Bump,
        },
        reserve(0, 0, 0, None),
        Op::Damage { lost: Lost::Res },
        Op::Resume { inst: 1 },
    ]);
}

/// Found by the generator in issue 37's CI run (shrunk), present before issue 37's scripts
/// (replayed with d38da65's reserve.lua and confirm.lua: the same failure): after a sale, the
/// other instance's change to 3 segments, an emptied store, a late reserve there and the
/// retention's expiry, an operator's plain resume of the 1-segment activity answers 200 where
/// the model expects 409 `store_lost_sales` (the store saw records in that segment and they are
/// gone). Every invariant held after each step before it; the disagreement is the resume's
/// answer (a plain resume lifts a fence; the version floor, made again by the 3-segment
/// prewarm, is what keeps version 1 off sale). Settled in issue 45 (in doubt, hold): the
/// resume checks the configured layout too when Redis records another, and a segment this
/// gateway saw sell whose records are gone is lost: 409.
#[test]
fn regression_a_resume_after_an_emptied_store_a_segment_change_and_expiry() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Reconfigure {
            inst: 1,
            act: 0,
            change: Change::Segments(3),
        },
        Op::Forget {
            how: Forget::Emptied,
        },
        Op::LateReserve {
            inst: 1,
            act: 0,
            user: 0,
        },
        Op::Expire { act: 0 },
        Op::Resume { inst: 0 },
    ]);
}

/// Found by the generator in issue 37's CI run (shrunk), present before issue 37's scripts
/// (replayed with d38da65's reserve.lua and confirm.lua: the same failure): a records hash
/// evicted, a recount, a snapshot, a batch sold in the recount's life, the store back to that
/// snapshot, a lost reply, and a batch: the model and the system agree at every step, and 8
/// units of a 6-unit stock end up the buyers'. The hole both shared (found in issue 45): the
/// lost reply's abandon wrote a tombstone into the segment gone back to the snapshot, and the
/// records hash, one field longer, passed for whole. An abandon now writes no tombstone into a
/// segment fenced, lost or gone back for the gateway (its fencing token, lua/release.lua).
#[test]
fn regression_a_store_back_to_a_snapshot_after_a_recount_sells_nothing_twice() {
    replay(vec![
        Op::Reserve {
            inst: 0,
            act: 0,
            user: 1,
            qty: 1,
            key: Some(0),
        },
        Op::Snapshot,
        Op::Reserve {
            inst: 0,
            act: 1,
            user: 1,
            qty: 1,
            key: None,
        },
        Op::Batch {
            inst: 0,
            act: 0,
            items: vec![(0, 1, None), (0, 1, None)],
        },
        Op::Forget {
            how: Forget::Evicted(Lost::Res),
        },
        Op::Recount {
            inst: 0,
            remaining: 2,
        },
        Op::Snapshot,
        Op::Batch {
            inst: 0,
            act: 0,
            items: vec![
                (3, 2, None),
                (2, 1, None),
                (0, 1, None),
                (2, 1, Some(0)),
                (0, 1, None),
            ],
        },
        Op::Forget { how: Forget::Older },
        Op::LostReply { handle: 2 },
        Op::Batch {
            inst: 0,
            act: 0,
            items: vec![(2, 1, Some(0)), (1, 1, Some(0))],
        },
    ]);
}

/// Found by the generator while issue 45 was built (shrunk): a sale, the retention's expiry, a
/// newer version put on sale by the other instance (a new life of the records), then purchases
/// of both versions: the newer version sells to the instance that saw the old one (the fencing
/// token refuses only a version it sold made again in a life it did not see begin).
#[test]
fn regression_a_newer_version_after_the_retention_sells_to_the_instance_that_saw_the_old() {
    replay(vec![
        reserve(0, 1, 0, None),
        Op::Expire { act: 1 },
        Op::Reconfigure {
            inst: 1,
            act: 1,
            change: Change::Bump,
        },
        Op::LateReserve {
            inst: 1,
            act: 1,
            user: 0,
        },
        reserve(0, 1, 0, None),
        reserve(1, 1, 0, None),
    ]);
}

/// Found by the generator while issue 45 was built (seed 3333, shrunk): a recount of an
/// activity never sold, a resume, the keys' expiry and a resume again.
#[test]
fn regression_a_resume_after_a_recount_and_the_keys_expiry() {
    replay(vec![
        Op::Recount {
            inst: 0,
            remaining: 6,
        },
        Op::Resume { inst: 0 },
        Op::Expire { act: 0 },
        Op::Resume { inst: 0 },
    ]);
}

/// Found by the generator while issue 45 was built (seed 3333, shrunk): a resume, a restart of
/// Redis (a new replication id), the keys' expiry (the master record and the known hash with
/// them) and the runbook's resume: the orders' check counts for the fence the gateway remembers.
#[test]
fn regression_the_orders_check_counts_for_a_fence_only_the_gateway_remembers() {
    replay(vec![
        Op::Resume { inst: 0 },
        Op::RestartRedis,
        Op::Expire { act: 0 },
        Op::Resume { inst: 0 },
    ]);
}

/// Found by the generator while issue 45 was built (seed 5555, shrunk): a sale, the store back
/// to a snapshot from before it, a late reserve's abandon (which wrote a tombstone and so hid the
/// loss) and a resume: the store went back, so the resume is refused (lost), and nothing sold
/// is sold again.
#[test]
fn regression_a_late_abandon_does_not_hide_a_store_gone_back() {
    replay(vec![
        Op::Prewarm { inst: 0 },
        Op::Snapshot,
        reserve(0, 0, 0, None),
        Op::Forget { how: Forget::Older },
        Op::LateReserve {
            inst: 0,
            act: 0,
            user: 0,
        },
        Op::Resume { inst: 0 },
    ]);
}

/// Found by the generator while issue 45 was built (seed 7777, shrunk): a sale, a recount (a
/// new life of the records), a resume, the records hash evicted and a resume: the records the
/// gateway saw are gone, so the resume is refused (lost). (A gateway's count of what it saw
/// comes from its own acknowledged sales only, never from a master check.)
#[test]
fn regression_records_evicted_after_a_recount_are_lost() {
    replay(vec![
        reserve(0, 0, 0, None),
        Op::Recount {
            inst: 0,
            remaining: 5,
        },
        Op::Resume { inst: 0 },
        Op::Forget {
            how: Forget::Evicted(Lost::Res),
        },
        Op::Resume { inst: 0 },
    ]);
}

/// Found by the generator (seed 31337, shrunk): a sale of the segmented activity, a version
/// bump, the keys' expiry, a sale under the new version, then a reserve whose abandon landed
/// first: the abandon's tombstone must stop it.
#[test]
fn regression_a_late_reserve_after_a_bump_and_expiry_takes_nothing() {
    replay(vec![
        reserve(0, 1, 0, None),
        Op::Reconfigure {
            inst: 0,
            act: 1,
            change: Change::Bump,
        },
        Op::Expire { act: 1 },
        reserve(0, 1, 2, None),
        Op::LateReserve {
            inst: 0,
            act: 1,
            user: 0,
        },
    ]);
}
