//! The failover fence, and the store forgetting. A Redis master replaced under flashgate (a
//! replica promoted, a master restarted under a new replication id) may lack reservations the
//! old one acknowledged: its stock is too high by them, and selling from it sells those units
//! twice. So each segment records, beside its stock, the identity of the master its stock was
//! accepted under (`<tag>:master` = INFO replication's `master_replid`), and the reserve script
//! compares it with the master it runs on before taking anything (`master_holds`, lua/lib.lua):
//! a fenced segment takes no reservation on the new master, from its first call, whichever
//! gateway asks.
//!
//! Whether the new master lacks anything is then judged, not assumed:
//! - What a gateway saw a segment hold stays known to it ([`watermark`]: the most reservation
//!   records any reply showed); while fenced, every gateway writes it back beside the segment
//!   (`<tag>:known`), so that every gateway and `reconcile` can tell whether the store is behind.
//!   A store holding fewer records than any gateway saw (an older snapshot, an emptied Redis, a
//!   replica that missed writes), or whose keys are gone (found by the prewarm: evicted, deleted,
//!   flushed), is **lost**: its record says `lost`, a plain resume is refused (409), and only an
//!   operator's recount (`POST .../resume` with `{"remaining": N}`, [`crate::stock::segments`])
//!   or a newer version sells it again. The prewarm never creates again a version this process
//!   saw on sale ([`Failover::was_on_sale`]).
//! - A fence no loss explains is lifted by a rule, without a human, once it stood
//!   [`FENCE_SETTLE`] (every live gateway wrote back by then) and the segment holds every record
//!   any gateway saw: `durable_restart` (the same server, not a promoted replica, that ran with
//!   `appendonly yes` and `appendfsync always` as the gateways last read it: it acknowledged
//!   nothing it had not written to disk) or `replicas_acknowledged` (a promoted replica, while
//!   `redis.ack_replicas` covers every replica the old master had: every winner was on it before
//!   it was answered, and no gateway reported a confirm, release or expiry the replicas did not
//!   acknowledge since the fence began, see [`unacked`]), or `same_process` (the very process the master was accepted under, by
//!   its run_id, and no replica since: Redis gave itself a new replication id, as it does when
//!   its first replica attaches). Any other fence stays until an operator's resume, as before.
//!
//! Where the identity lives: in Redis, beside the stock (replicated with it: a promoted replica
//! holds the old master's identity, not its own), AND in each gateway's memory (what it last saw
//! accepted per segment: if the record itself was lost with the data, a gateway that saw the old
//! master still refuses the new one). Only the record decides while it exists.
//! Approximations: a store that lost data while no running gateway had seen it (every gateway
//! restarted since) cannot be told from a new one: it is accepted, and only the backend's
//! orders (`reconcile --orders`) show the loss. The persistence the rule trusts is what the
//! gateways read last (every [`CHECK_INTERVAL`]): a change to `everysec` followed by a crash
//! within that second is taken for `always`.
//!
//! Every gateway checks every configured activity's segments each [`CHECK_INTERVAL`] (one
//! `CONFIG GET` and one script call per segment), for the gauge `flashgate_activity_fenced`, the
//! admin view, the rules, and to answer `unavailable` without asking Redis.

pub mod doubt;
pub mod known;
pub mod resume;
pub mod unacked;
pub mod watermark;

use super::scripts::master::{MasterCall, Seen, Verdict};
use super::{Layout, Segment, StockStore, StoreError};
use crate::config::Activity;
use crate::label_enum;
use parking_lot::RwLock;
pub use resume::Resumed;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use watermark::Watermark;

/// How often each gateway checks each activity's masters: a promoted replica is fenced in the
/// gauge and the admin view within this (its first reserve is refused at once, in Redis).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long a fence stands before a rule may lift it: every live gateway's check (one each
/// [`CHECK_INTERVAL`]) has written back what it saw by then. A durable restart sells again
/// within this plus two checks of the master answering (under 5 s).
pub const FENCE_SETTLE: Duration = Duration::from_millis(1500);

/// How long a fence no loss explains stands before it is told as an error: a rule lifts an
/// ordinary restart's (a durable one, the same process) within [`FENCE_SETTLE`] plus two checks,
/// so until then it is a warning, and an SRE paged by errors is paged only for a fence that
/// needs them.
pub const FENCE_NEEDS_A_HUMAN: Duration = Duration::from_secs(5);

/// How long a lifted fence is remembered: one back within it is the same trouble.
pub const FENCE_FLAP: Duration = Duration::from_secs(60);

/// How a standing fence was told in the log: a warning when it began (or an error at once when
/// the segment is lost), an error once it stood [`FENCE_NEEDS_A_HUMAN`].
#[derive(Debug, Clone, Copy)]
struct Told {
    since: std::time::Instant,
    as_error: bool,
}

label_enum! {
    /// Why a fence was lifted (`flashgate_fence_lifted_total{reason}`).
    pub enum LiftReason {
        DurableRestart => "durable_restart",
        ReplicasAcknowledged => "replicas_acknowledged",
        SameProcess => "same_process",
        Resume => "resume",
        Recount => "recount",
    }
}

impl LiftReason {
    fn of_rule(rule: &str) -> Option<LiftReason> {
        match rule {
            "durable_restart" => Some(LiftReason::DurableRestart),
            "replicas_acknowledged" => Some(LiftReason::ReplicasAcknowledged),
            "same_process" => Some(LiftReason::SameProcess),
            _ => None,
        }
    }
}

impl serde::Serialize for LiftReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Why an activity is fenced: a segment's recorded master and the one answering now, and
/// whether the segment is lost.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fence {
    pub segment: u32,
    /// The identity recorded beside the stock ('' if none: the gateway remembered another;
    /// `lost` once the segment was found to hold less than was sold).
    pub recorded: String,
    /// The identity of the master answering now.
    pub current: String,
    /// Why the segment is lost (`behind`, `emptied`, `keys_lost`), if it is: a plain resume
    /// is refused, a recount sells it again.
    pub lost: Option<String>,
    /// The reservation records the segment holds now.
    pub held: u64,
    /// The most this gateway saw it hold (in its epoch).
    pub seen: u64,
}

/// The last fence a rule or a call lifted on an activity (the admin view).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Lifted {
    pub reason: LiftReason,
    /// When (unix ms, this gateway's clock).
    pub at_ms: u64,
}

/// What one check of an activity's segments found.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// The first fenced or lost segment, if any.
    pub fence: Option<Fence>,
    /// A rule lifted a fence in this check.
    pub lifted: Option<LiftReason>,
}

/// What this process knows of the masters and of what the segments held (see the module doc).
#[derive(Default)]
pub struct Failover {
    /// The identity last seen accepted, per master record (one per segment).
    seen: RwLock<HashMap<String, String>>,
    /// Master records found fenced or lost (by a check or a reserve), until accepted.
    fenced: RwLock<HashSet<String>>,
    /// The fenced activities, with why (by the last check), and how each was told (see
    /// [`Told`]).
    fences: RwLock<HashMap<Arc<str>, (Fence, Told)>>,
    /// Fences lifted lately, with how they were told: one that comes back within
    /// [`FENCE_FLAP`] of its lift goes on from there (a store restarting again and again is
    /// told as an error, and does not keep `/readyz` flapping).
    lately_lifted: RwLock<HashMap<Arc<str>, (Told, std::time::Instant)>>,
    /// Accepts made by this process: a check that read the record before an accept and ends
    /// after it says nothing (it would fence again what was just accepted).
    accepts: AtomicU64,
    /// What each segment was seen to hold, per master record.
    marks: RwLock<HashMap<String, Arc<Watermark>>>,
    /// Versions this process saw on sale, with when each went on sale in each segment (unix ms,
    /// Redis's clock): never created again, nor taken when made again.
    on_sale: RwLock<HashMap<Sold, Vec<u64>>>,
    /// The last fence lifted per activity.
    lifted: RwLock<HashMap<Arc<str>, Lifted>>,
    /// Fate writes `redis.ack_replicas` replicas did not acknowledge, per master record.
    unacked: unacked::Unacked,
    /// Stock lanes born on hold (made after their sale opened, `lua/prewarm.lua`), until a
    /// check finds them armed.
    birth_holds: RwLock<HashSet<Arc<str>>>,
}

/// An activity's version (the key of what was seen on sale).
type Sold = (Arc<str>, u64);

impl Failover {
    /// The identity this process last saw accepted under `record` ('' if none).
    pub(in crate::stock) fn expected(&self, record: &str) -> String {
        self.seen.read().get(record).cloned().unwrap_or_default()
    }

    /// A reserve under `record` was refused by the fence.
    pub(in crate::stock) fn saw_fenced(&self, record: &str) {
        self.fenced.write().insert(record.to_owned());
    }

    /// What the segment of master record `record` was seen to hold.
    pub(in crate::stock) fn watermark(&self, record: &str) -> Arc<Watermark> {
        if let Some(mark) = self.marks.read().get(record) {
            return mark.clone();
        }
        self.marks
            .write()
            .entry(record.to_owned())
            .or_default()
            .clone()
    }

    /// The version was seen on sale (prewarmed in every segment) by this process, born in each
    /// segment at `births`.
    pub(in crate::stock) fn saw_on_sale(
        &self,
        activity: &Arc<str>,
        version: u64,
        births: Vec<u64>,
    ) {
        let key = (activity.clone(), version);
        if self.on_sale.read().get(&key) != Some(&births) {
            self.on_sale.write().insert(key, births);
        }
    }

    /// Whether this process saw the version on sale: if its keys are gone, the store forgot
    /// what it sold, and the version is never created again from the configuration.
    pub fn was_on_sale(&self, activity: &Arc<str>, version: u64) -> bool {
        self.on_sale
            .read()
            .contains_key(&(activity.clone(), version))
    }

    /// `lane`'s stock was born on hold here (prewarm): not ready to sell until a check arms it.
    pub(in crate::stock) fn birth_held(&self, lane: &Arc<str>) {
        self.birth_holds.write().insert(lane.clone());
    }

    /// Whether `lane`'s stock is on its birth hold (as this process last saw it).
    pub fn on_birth_hold(&self, lane: &str) -> bool {
        self.birth_holds.read().contains(lane)
    }

    /// The newest version of `activity` this process saw on sale.
    pub fn newest_on_sale(&self, activity: &Arc<str>) -> Option<u64> {
        self.on_sale
            .read()
            .keys()
            .filter(|(id, _)| id == activity)
            .map(|(_, version)| *version)
            .max()
    }

    /// When this process saw the version go on sale in `segment` (0 if it does not know).
    pub(in crate::stock) fn born(&self, activity: &Arc<str>, version: u64, segment: u32) -> u64 {
        self.on_sale
            .read()
            .get(&(activity.clone(), version))
            .and_then(|b| b.get(segment as usize).copied())
            .unwrap_or(0)
    }

    fn accepts(&self) -> u64 {
        self.accepts.load(Ordering::SeqCst)
    }

    fn saw(&self, record: &str, verdict: &Verdict, accepts_before: u64) {
        if self.accepts() != accepts_before {
            return;
        }
        match verdict.verdict.as_str() {
            "fenced" | "lost" => {
                self.fenced.write().insert(record.to_owned());
            }
            _ => {
                self.seen
                    .write()
                    .insert(record.to_owned(), verdict.current.clone());
                self.fenced.write().remove(record);
            }
        }
    }

    /// Why `activity` is fenced, if it is.
    /// `activity` is a stock lane's name (`Activity::lane`).
    pub fn fence(&self, activity: &str) -> Option<Fence> {
        self.fences.read().get(activity).map(|(f, _)| f.clone())
    }

    /// Whether `activity`'s fence (if any) may still be lifted by a rule: it stands, no loss
    /// explains it, and it is younger than [`FENCE_NEEDS_A_HUMAN`]. While it is, the gateway is
    /// not ready: an ordinary restart's fence passes within seconds. Once it needs a human the
    /// gateway is ready again (every gateway is fenced alike: the shop's other routes must not
    /// lose the whole fleet), answering `unavailable` for that sale until it is resumed.
    /// `activity` is a stock lane's name (`Activity::lane`).
    pub fn fence_settling(&self, activity: &str) -> bool {
        self.fences
            .read()
            .get(activity)
            .is_some_and(|(fence, told)| {
                fence.lost.is_none() && told.since.elapsed() < FENCE_NEEDS_A_HUMAN
            })
    }

    /// The last fence lifted on `activity`, if any (since this process started).
    pub fn lifted(&self, activity: &str) -> Option<Lifted> {
        self.lifted.read().get(activity).copied()
    }

    fn record_lift(&self, activity: &Arc<str>, reason: LiftReason) {
        let at_ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
        self.lifted
            .write()
            .insert(activity.clone(), Lifted { reason, at_ms });
    }
}

impl StockStore {
    /// This process's knowledge of the masters.
    pub fn failover(&self) -> &Failover {
        &self.failover
    }

    /// Whether `activity` is fenced: a check or a reserve found one of its segments on another
    /// master than the one its stock was accepted under, or lost.
    pub fn is_fenced(&self, activity: &Activity) -> bool {
        let fenced = self.failover.fenced.read();
        if fenced.is_empty() {
            return false;
        }
        Layout::of(activity)
            .segments()
            .any(|s| fenced.contains(&self.keys.of(s).master()))
    }

    /// What this process passes to the master script for `segment` of `activity`.
    async fn seen(&self, segment: Segment<'_>, activity: &Activity, persistence: bool) -> Seen {
        let record = self.keys.of(segment).master();
        let mark = self.failover.watermark(&record);
        let (most, life) = mark.seen();
        Seen {
            expected: self.failover.expected(&record),
            most,
            life,
            version: mark.version(),
            persistence: if persistence {
                self.persistence(segment).await
            } else {
                String::new()
            },
            unacked: self.failover.unacked.holds(&record),
            born: self
                .failover
                .born(&activity.lane, activity.version, segment.index()),
        }
    }

    /// One master call for `segment`, and what this process learns from it.
    async fn master_call(
        &self,
        segment: Segment<'_>,
        activity: &Activity,
        call: MasterCall,
    ) -> Result<Verdict, StoreError> {
        let record = self.keys.of(segment).master();
        // A check first sends again every unacknowledged fate write of the segment; its call
        // then says this gateway holds some (`unacked`), and its WAIT covers them.
        let check = matches!(call, MasterCall::Check);
        let answered = if check {
            self.resend_unacked(segment).await
        } else {
            Vec::new()
        };
        let mut seen = self
            .seen(
                segment,
                activity,
                check || matches!(call, MasterCall::Accept),
            )
            .await;
        seen.unacked |= !answered.is_empty();
        let accepts = self.failover.accepts();
        let wait = check && seen.unacked;
        let verdict = match self.master(segment, activity, &seen, call, wait).await {
            Ok(verdict) => verdict,
            Err(e) => {
                self.after_check(segment, answered, None);
                return Err(e);
            }
        };
        self.after_check(segment, answered, verdict.acknowledged);
        self.failover.saw(&record, &verdict, accepts);
        Ok(verdict)
    }

    /// Checks every segment of `activity` (each gateway, every [`CHECK_INTERVAL`]): the gauge,
    /// the admin view and the rules follow. Returns the fence, if any, and a rule's lift.
    pub async fn check_master(&self, activity: &Activity) -> Result<Checked, StoreError> {
        let accepts = self.failover.accepts();
        let mut checked = Checked::default();
        let mut born = false;
        for segment in Layout::of(activity).segments() {
            let verdict = self
                .master_call(segment, activity, MasterCall::Check)
                .await?;
            if matches!(verdict.verdict.as_str(), "fenced" | "lost") {
                // In doubt, hold: what is pending under a fence may be a sale whose confirm the
                // store lost (a snapshot, a restart, a replica): held before any rule or
                // operator lifts the fence (the sweep does nothing while it stands), so that
                // its expiry never puts the unit on sale again. Held ones are parked: a call
                // after the first finds nothing to do.
                self.hold_pending_in_doubt(activity, segment).await?;
            }
            born |= verdict.verdict == "born";
            match verdict.verdict.as_str() {
                "fenced" | "lost" if checked.fence.is_none() => {
                    checked.fence = Some(self.fence_of(segment, &verdict));
                }
                "lifted" => {
                    let reason = LiftReason::of_rule(&verdict.detail);
                    tracing::info!(activity = %activity.id,
                        variant = activity.variant.as_deref(), segment = segment.index(),
                        rule = %verdict.detail, previous = %verdict.recorded, now = %verdict.current,
                        "the Redis master changed and the fence was lifted by a rule: it lost \
                         nothing acknowledged; the activity sells again");
                    if let Some(reason) = reason {
                        self.lifted(activity, reason);
                    }
                    checked.lifted = checked.lifted.or(reason);
                }
                _ => {}
            }
        }
        if self.failover.accepts() == accepts {
            self.show(activity, checked.fence.clone());
        }
        if born {
            self.failover.birth_held(&activity.lane);
        } else {
            self.failover.birth_holds.write().remove(&activity.lane);
        }
        Ok(checked)
    }

    fn fence_of(&self, segment: Segment<'_>, verdict: &Verdict) -> Fence {
        let record = self.keys.of(segment).master();
        Fence {
            segment: segment.index(),
            recorded: verdict.recorded.clone(),
            current: verdict.current.clone(),
            lost: (verdict.verdict == "lost").then(|| verdict.detail.clone()),
            held: verdict.held,
            seen: self.failover.watermark(&record).seen().0,
        }
    }

    /// A fence was lifted on `activity` (a rule, a resume, a recount): counted and shown.
    pub(in crate::stock) fn lifted(&self, activity: &Activity, reason: LiftReason) {
        self.redis
            .metrics()
            .fence_lifted
            .with_label_values(&[reason.as_str()])
            .inc();
        self.failover.record_lift(&activity.lane, reason);
    }

    /// Marks `segment` of `activity` lost (`reason`): a gateway found keys of a version on sale
    /// gone (flushed, evicted, deleted, an emptied Redis). Every gateway's reserve there is
    /// refused from now, a plain resume too, until a recount or a newer version. `since`: the
    /// recount stamp the finder read with what it found (0 none): a recount since then made
    /// what it found stale, and nothing is marked (`None`: marked whatever came since).
    pub async fn mark_lost(
        &self,
        activity: &Activity,
        segment: Segment<'_>,
        reason: &'static str,
        since: Option<u64>,
    ) -> Result<(), StoreError> {
        let verdict = self
            .master_call(segment, activity, MasterCall::Lost { reason, since })
            .await?;
        if verdict.verdict != "lost" {
            return Ok(());
        }
        tracing::error!(activity = %activity.id, segment = segment.index(), reason,
            held = verdict.held,
            "Redis holds less of the sale than it sold (its keys are gone): nothing is sold \
             until an operator resumes it with the counted remaining stock");
        let fence = self.fence_of(segment, &verdict);
        self.show(activity, Some(fence));
        Ok(())
    }

    pub(super) fn show(&self, activity: &Activity, fence: Option<Fence>) {
        let mut fences = self.failover.fences.write();
        match fence {
            Some(fence) => {
                let before = fences.get(&activity.lane);
                let changed = before.map(|(f, _)| &f.lost) != Some(&fence.lost);
                let lately = self
                    .failover
                    .lately_lifted
                    .read()
                    .get(&activity.lane)
                    .filter(|(_, lifted)| lifted.elapsed() < FENCE_FLAP)
                    .map(|(told, _)| *told);
                let mut told = match before {
                    Some((_, told)) if !changed => *told,
                    _ => lately.unwrap_or(Told {
                        since: std::time::Instant::now(),
                        as_error: false,
                    }),
                };
                let needs_a_human =
                    fence.lost.is_some() || told.since.elapsed() >= FENCE_NEEDS_A_HUMAN;
                if needs_a_human && !told.as_error {
                    told.as_error = true;
                    tracing::error!(activity = %activity.id,
                        variant = activity.variant.as_deref(), segment = fence.segment,
                        recorded = %fence.recorded, current = %fence.current,
                        lost = fence.lost.as_deref().unwrap_or("no"),
                        fenced_for_ms = told.since.elapsed().as_millis() as u64,
                        "Redis master changed under the activity (failover or restart), or it \
                         lost what it sold: fenced, and no rule lifts it; not selling until an \
                         operator resumes it (see the runbook)");
                } else if changed {
                    tracing::warn!(activity = %activity.id,
                        variant = activity.variant.as_deref(), segment = fence.segment,
                        recorded = %fence.recorded, current = %fence.current,
                        "Redis master changed under the activity (failover or restart): fenced \
                         while the gateways compare what it holds; a rule lifts it within \
                         seconds if it lost nothing acknowledged, else this becomes an error");
                }
                fences.insert(activity.lane.clone(), (fence, told));
            }
            None => {
                if let Some((_, told)) = fences.remove(&activity.lane) {
                    let mut lately = self.failover.lately_lifted.write();
                    lately.retain(|_, (_, at)| at.elapsed() < FENCE_FLAP);
                    lately.insert(activity.lane.clone(), (told, std::time::Instant::now()));
                }
            }
        }
        // Of the activity: 1 while any of its stock lanes is fenced.
        let id = &*activity.id;
        let any = fences.keys().any(|lane| {
            lane.strip_prefix(id)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('~'))
        });
        self.redis
            .metrics()
            .activity_fenced
            .with_label_values(&[id])
            .set(i64::from(any));
    }
}
