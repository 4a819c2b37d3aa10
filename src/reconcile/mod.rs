//! `flashgate reconcile`: proves, per activity and stock version, that every unit is accounted
//! for. Two independent checks on one atomic snapshot (MULTI/EXEC) of Redis:
//!
//! 1. the ledger balances: `initial + restocked == remaining + pending + confirmed + retired`;
//! 2. the ledger agrees with the reservation records: its pending, confirmed, released,
//!    retired and held-in-doubt units equal the sums over the records of that version.
//!
//! The snapshot reads every reservation record of an activity, O(reservations): an operator
//! command, not something the request path does (the gateway's periodic check is check 1 only).
//!
//! A store that forgot what it sold is consistent with itself: a third check ([`forgot`]) reads
//! what the gateways know it must hold, and the activity's own record of what was on sale.

pub mod forgot;
mod orders;

pub use orders::{compare_orders, run_orders_cli, OrdersReport};

use crate::config::{Activity, Settings};
use crate::stock::prelude::*;
use crate::stock::{
    segments, Layout, LedgerRow, RecordState, ReservationRecord, Segment, Snapshot, StockStore,
    StoreError,
};
use std::fmt::Write;
use std::sync::Arc;

/// One version's figures: the ledger and what the records say.
#[derive(Debug, Clone)]
pub struct VersionReport {
    pub activity: Arc<str>,
    pub ledger: LedgerRow,
    pub records_pending: i64,
    pub records_confirmed: i64,
    pub records_released: i64,
    pub records_retired: i64,
    /// Pending and held in doubt (flag `d`).
    pub records_held_in_doubt: i64,
}

impl VersionReport {
    fn new(label: Arc<str>, ledger: LedgerRow, records: &[ReservationRecord]) -> Self {
        let mut report = VersionReport {
            activity: label,
            ledger,
            records_pending: 0,
            records_confirmed: 0,
            records_released: 0,
            records_retired: 0,
            records_held_in_doubt: 0,
        };
        for r in records
            .iter()
            .filter(|r| r.ver == ledger.version && !r.tombstone)
        {
            let qty = r.qty as i64;
            match r.state {
                RecordState::Pending => {
                    report.records_pending += qty;
                    if r.in_doubt {
                        report.records_held_in_doubt += qty;
                    }
                }
                RecordState::Confirmed => report.records_confirmed += qty,
                RecordState::Released => {
                    report.records_released += qty;
                    if r.returned == Some(false) {
                        report.records_retired += qty;
                    }
                }
            }
        }
        report
    }

    /// Whether the ledger agrees with the reservation records.
    pub fn records_agree(&self) -> bool {
        if !self.ledger.ledger {
            // No ledger (never prewarmed, or expired): nothing to agree with.
            return true;
        }
        (
            self.ledger.pending,
            self.ledger.confirmed,
            self.ledger.released,
            self.ledger.retired - self.ledger.unsold_retired,
            self.ledger.held_in_doubt,
        ) == (
            self.records_pending,
            self.records_confirmed,
            self.records_released,
            self.records_retired,
            self.records_held_in_doubt,
        )
    }

    /// Balanced, agreeing with the records, and no unit the backend accepted after its
    /// release (an oversell the gateway saw is never clean, covered or not).
    pub fn clean(&self) -> bool {
        self.ledger.drift() == 0 && self.records_agree() && self.ledger.late_accepted == 0
    }
}

/// A segment whose transfers do not account for the units it moved.
#[derive(Debug, Clone)]
pub struct TransferMismatch {
    pub segment: Arc<str>,
    pub what: String,
}

/// The reconciliation of every (or one) configured activity.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub versions: Vec<VersionReport>,
    pub transfer_mismatches: Vec<TransferMismatch>,
    /// Activities configured with another segment count than Redis recorded: (activity,
    /// configured, recorded). Reconciled as recorded; the gateway refuses such a configuration.
    pub layout_notes: Vec<(Arc<str>, u32, u32)>,
    /// What the store forgot of what it sold (lost, behind, missing keys).
    pub forgotten: Vec<forgot::Forgotten>,
}

impl Report {
    pub fn clean(&self) -> bool {
        self.versions.iter().all(VersionReport::clean)
            && self.transfer_mismatches.is_empty()
            && self.forgotten.is_empty()
    }

    /// A fixed-width table, one row per activity and version.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}  records",
            "activity",
            "version",
            "initial",
            "restocked",
            "remaining",
            "pending",
            "confirmed",
            "released",
            "retired",
            "drift"
        );
        for v in &self.versions {
            let l = &v.ledger;
            let remaining = if l.stock_key {
                l.remaining.to_string()
            } else {
                "-".to_owned()
            };
            let records = if v.records_agree() {
                "ok".to_owned()
            } else {
                format!(
                    "MISMATCH (records: pending {} confirmed {} released {} retired {} held in \
                     doubt {}; ledger: held in doubt {})",
                    v.records_pending,
                    v.records_confirmed,
                    v.records_released,
                    v.records_retired,
                    v.records_held_in_doubt,
                    v.ledger.held_in_doubt
                )
            };
            let _ = writeln!(
                out,
                "{:<16} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}  {}",
                v.activity,
                l.version,
                l.initial,
                l.restocked,
                remaining,
                l.pending,
                l.confirmed,
                l.released,
                l.retired,
                l.drift(),
                records
            );
        }
        self.notes(&mut out);
        out
    }

    /// The lines under the table: what no row shows.
    fn notes(&self, out: &mut String) {
        for v in self.versions.iter().filter(|v| v.ledger.late_accepted > 0) {
            let l = &v.ledger;
            let _ = writeln!(
                out,
                "{} v{}: LATE ACCEPTED: the backend accepted {} unit(s) after their reservation was released: {} covered from stock, {} oversold (find them: type late_accept in the event stream)",
                v.activity,
                l.version,
                l.late_accepted,
                l.late_accepted - l.oversold,
                l.oversold
            );
        }
        for m in &self.transfer_mismatches {
            let _ = writeln!(out, "{}: TRANSFER MISMATCH: {}", m.segment, m.what);
        }
        for f in &self.forgotten {
            let _ = writeln!(out, "{} segment {}: {}", f.activity, f.segment, f.what);
        }
        for v in self.versions.iter().filter(|v| v.ledger.recounted != 0) {
            let _ = writeln!(
                out,
                "note: {} v{}: an operator's recount took {} unit(s) off sale (the store had \
                 forgotten what it sold; type recount in the event stream)",
                v.activity, v.ledger.version, v.ledger.recounted
            );
        }
        for (activity, configured, recorded) in &self.layout_notes {
            let _ = writeln!(
                out,
                "note: {activity} is configured with {configured} segments but Redis recorded {recorded}: reconciled as recorded (the gateway refuses this configuration)"
            );
        }
    }
}

/// Why reconciliation could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("activity {0:?} is not configured")]
    UnknownActivity(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Every Redis address refused the connection (nothing listens there), as opposed to a
    /// Redis that is slow to answer.
    #[error("cannot connect to Redis at {0}: connection refused")]
    Refused(String),
    /// Versions were put on sale faster than a snapshot could be taken: no honest answer yet.
    #[error("segment {0}: versions changed during every read; run reconcile again")]
    Busy(String),
    /// `flashgate report --prometheus`: Prometheus did not answer the query.
    #[error("prometheus: {0}")]
    Prometheus(String),
}

/// How many times a segment's snapshot is taken again when its versions changed meanwhile.
const SNAPSHOT_ATTEMPTS: usize = 16;
/// Version numbers past the newest listed that a snapshot reads as well.
const VERSIONS_AHEAD: u64 = 8;

/// Reconciles every configured activity, or only `only`: each stock lane (an activity, or
/// each variant of one, a line per variant).
pub async fn reconcile(
    settings: &Settings,
    store: &StockStore,
    only: Option<&str>,
) -> Result<Report, ReconcileError> {
    let activities: Vec<&Arc<Activity>> = match only {
        Some(id) => {
            settings
                .activities
                .get(id)
                .ok_or_else(|| ReconcileError::UnknownActivity(id.to_owned()))?;
            settings.activities.lanes_of(id).collect()
        }
        None => settings.activities.lanes().collect(),
    };
    let mut report = Report::default();
    for activity in &activities {
        reconcile_activity(store, activity, &mut report).await?;
    }
    // Lanes Redis still holds that the configuration no longer sells (a removed variant, the
    // activity's own lane from before it gained variants): their books must add up too.
    for (name, _) in store.registered().await? {
        if activities.iter().any(|a| *a.lane == *name) {
            continue;
        }
        let (id, variant) = match name.split_once('~') {
            Some((id, v)) => (id, Some(v)),
            None => (name.as_str(), None),
        };
        if only.is_some_and(|o| o != id) {
            continue;
        }
        if let Some(former) = settings.activities.lane_or_former(id, variant) {
            reconcile_activity(store, &former, &mut report).await?;
        }
    }
    Ok(report)
}

/// One activity: what is in Redis, in the layout Redis recorded, segment by segment; then
/// every transfer between its segments.
async fn reconcile_activity(
    store: &StockStore,
    activity: &Activity,
    report: &mut Report,
) -> Result<(), ReconcileError> {
    let layout = segments::recorded_layout(store, activity).await?;
    if layout.count() != activity.segments {
        report
            .layout_notes
            .push((activity.id.clone(), activity.segments, layout.count()));
    }
    let context = forgot::Context::read(store, activity, layout.is_segmented()).await?;
    let mut received = Vec::new();
    for segment in layout.segments() {
        let snapshot = segment_snapshot(store, activity, segment).await?;
        let known = store.known(segment).await?;
        report
            .forgotten
            .extend(context.judge(segment.index(), &snapshot, &known));
        // A variant's line names it: `<tag> variant=<id>`.
        let label: Arc<str> = match &activity.variant {
            Some(v) => Arc::from(format!("{} variant={v}", segment.tag())),
            None => Arc::from(segment.tag()),
        };
        check_books(&snapshot, &label, report);
        for (id, qty) in &snapshot.books.received {
            received.push((segment.index(), id.clone(), *qty));
        }
        for ledger in snapshot.ledgers {
            report
                .versions
                .push(VersionReport::new(label.clone(), ledger, &snapshot.records));
        }
    }
    if layout.is_segmented() {
        check_given(store, &layout, received, report).await?;
    }
    Ok(())
}

/// A segment's versions and their ledgers, read in one transaction: a version put on sale
/// (and a unit of it moved) between the two reads would look like a transfer mismatch. The
/// configured version is read too (a segment that lost its meta, refused, still has its
/// ledger checked), and the next few version numbers, in case one is put on sale while the
/// snapshot is on its way; versions bumped faster than that are caught by taking the snapshot
/// again. Versions read ahead that do not exist are left out, and so is the configured version
/// where the meta does not list it and it has no keys (never put on sale here).
async fn segment_snapshot(
    store: &StockStore,
    activity: &Activity,
    segment: Segment<'_>,
) -> Result<Snapshot, ReconcileError> {
    let with_next = |mut listed: Vec<u64>| {
        let newest = listed.iter().copied().max().unwrap_or(activity.version);
        listed.push(activity.version);
        listed.extend(newest.saturating_add(1)..=newest.saturating_add(VERSIONS_AHEAD));
        listed.sort_unstable();
        listed.dedup();
        listed
    };
    let mut versions = with_next(store.meta(segment).await?.versions);
    let mut snapshot = store.snapshot(segment, &versions).await?;
    let mut attempts = 0;
    while !snapshot.versions.iter().all(|v| versions.contains(v)) {
        attempts += 1;
        if attempts > SNAPSHOT_ATTEMPTS {
            return Err(ReconcileError::Busy(segment.tag().to_owned()));
        }
        versions = with_next(snapshot.versions.clone());
        snapshot = store.snapshot(segment, &versions).await?;
    }
    let on_record = snapshot.versions.clone();
    let listed = on_record.contains(&activity.version);
    snapshot.ledgers.retain(|l| {
        let has_keys = l.ledger || l.stock_key;
        let on_meta = if l.version == activity.version {
            listed
        } else {
            on_record.contains(&l.version)
        };
        has_keys || on_meta
    });
    Ok(snapshot)
}

/// Every unit a segment moved out is one of its own transfers, and every unit it moved in
/// one it received (both read with the ledgers, in one snapshot).
fn check_books(snapshot: &Snapshot, label: &Arc<str>, report: &mut Report) {
    let given: i64 = snapshot
        .books
        .open
        .iter()
        .chain(&snapshot.books.acknowledged)
        .map(|t| t.qty as i64)
        .sum();
    let moved_out: i64 = snapshot.ledgers.iter().map(|l| l.moved_out).sum();
    let got: i64 = snapshot.books.received.values().map(|&q| q as i64).sum();
    let moved_in: i64 = snapshot.ledgers.iter().map(|l| l.moved_in).sum();
    if given != moved_out || got != moved_in {
        report.transfer_mismatches.push(TransferMismatch {
            segment: label.clone(),
            what: format!(
                "moved out {moved_out} but its transfers hold {given}; moved in {moved_in} but it received {got}"
            ),
        });
    }
}

/// Every transfer a segment received (`received`: receiver, id, units) was given by another,
/// with the same units: the givers are read after the receivers (a transfer is given before it
/// is received, and never forgotten), so one taking place meanwhile is never a false alarm.
async fn check_given(
    store: &StockStore,
    layout: &Layout,
    received: Vec<(u32, String, u64)>,
    report: &mut Report,
) -> Result<(), ReconcileError> {
    let mut given = std::collections::HashMap::new();
    let mut acknowledged = Vec::new();
    for segment in layout.segments() {
        let (open, acked) = store.transfers_given(segment).await?;
        acknowledged.extend(acked.iter().map(|t| (segment.index(), t.clone())));
        for t in open.into_iter().chain(acked) {
            given.insert(t.id.clone(), t);
        }
    }
    check_acknowledged(store, layout, &received, &acknowledged, report).await?;
    for (to, id, qty) in received {
        match given.get(&id) {
            Some(t) if t.to == to && t.qty == qty => {}
            _ => report.transfer_mismatches.push(TransferMismatch {
                segment: Arc::from(layout.segment(to).expect("in range").tag()),
                what: format!("received transfer {id} ({qty} units) that no segment gave"),
            }),
        }
    }
    Ok(())
}

/// Every transfer a segment acknowledged arrived where it was sent: a giver forgets a transfer
/// (acknowledges it) only once it landed, so one acknowledged and not received is a lost unit,
/// counted out of one segment and into none. The receivers' books were read before the givers';
/// one received meanwhile is looked up again (a received transfer is never forgotten).
async fn check_acknowledged(
    store: &StockStore,
    layout: &crate::stock::Layout,
    received: &[(u32, String, u64)],
    acknowledged: &[(u32, crate::stock::Transfer)],
    report: &mut Report,
) -> Result<(), ReconcileError> {
    let seen: std::collections::HashSet<(u32, &str)> = received
        .iter()
        .map(|(to, id, _)| (*to, id.as_str()))
        .collect();
    for (giver, t) in acknowledged {
        if seen.contains(&(t.to, t.id.as_str())) {
            continue;
        }
        let arrived = match layout.segment(t.to) {
            Some(receiver) => store.received(receiver, &t.id).await?,
            None => false,
        };
        if !arrived {
            let segment = layout.segment(*giver).expect("in range");
            report.transfer_mismatches.push(TransferMismatch {
                segment: Arc::from(segment.tag()),
                what: format!(
                    "acknowledged transfer {} ({} units to segment {}) that never arrived there: its units are lost",
                    t.id, t.qty, t.to
                ),
            });
        }
    }
    Ok(())
}

/// Runs `flashgate reconcile` on its own runtime: prints the table, returns whether it is clean.
pub fn run_cli(settings: Settings, only: Option<&str>) -> Result<Report, ReconcileError> {
    with_store(&settings, async |store| {
        reconcile(&settings, store, only).await
    })
}

/// `flashgate draw`: the audit of one configured activity's pre-queue draw
/// (`waiting::audit`), on a store of its own.
pub fn draw_cli(
    settings: Settings,
    activity: &str,
) -> Result<crate::waiting::audit::Audit, ReconcileError> {
    let act = settings
        .activities
        .get(activity)
        .cloned()
        .ok_or_else(|| ReconcileError::UnknownActivity(activity.to_owned()))?;
    with_store(&settings, async |store| {
        Ok(crate::waiting::audit::audit(store, &act).await?)
    })
}

/// Runs `work` against a store of its own on a current-thread runtime (the CLI commands).
pub(crate) fn with_store<T>(
    settings: &Settings,
    work: impl AsyncFnOnce(&StockStore) -> Result<T, ReconcileError>,
) -> Result<T, ReconcileError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Redis(redis::RedisError::from(e)))?;
    runtime.block_on(async {
        let store = StockStore::new(&settings.redis, Arc::new(crate::metrics::Metrics::new()))?;
        work(&store).await
    })
}
