//! What the stock lanes of an activity hold: each lane's ledgers (the units, exact, as
//! `reconcile` and the admin view read them), when it sold out and was restocked (the ledger's
//! `sold_out_ms` and `restock@<ms>`, see `lua/reserve.lua` and `lua/restock.lua`), and every
//! reservation record, read a page at a time (HSCAN) into the timeline and the buyers' sets.
//!
//! Memory: the timeline (a row per second) and two sets of 8-byte hashes of user ids (buyers
//! holding a confirmed unit, buyers holding a pending one), bounded by the number of buyers,
//! never by the records: a page of records is dropped once counted.
//!
//! Approximations: a buyer is known by a 64-bit hash of their id (two buyers of a million share
//! one with a chance of about 3 in 10^8); a reservation confirmed then released (a refund) is
//! counted among the releases at its release, its confirmation's time being no longer kept.

use super::timeline::{Count, Timeline};
use crate::config::Activity;
use crate::stock::prelude::*;
use crate::stock::{
    segments, Layout, LedgerRow, RecordState, ReservationRecord, StockStore, StoreError, StoreOp,
};
use serde::Serialize;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

/// Records read a page at a time.
const PAGE: usize = 2000;

/// A lane's units, summed over its segments and every version it had.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Units {
    /// Confirmed units.
    pub sold: i64,
    pub released: i64,
    pub pending: i64,
    /// Of `pending`, units held in doubt (a store event: off sale until a confirm, a release or
    /// the order lookup settles them; see `lua/doubt.lua`).
    pub held_in_doubt: i64,
    pub restocked: i64,
}

impl Units {
    fn add(&mut self, row: &LedgerRow) {
        self.sold += row.confirmed;
        self.released += row.released;
        self.pending += row.pending;
        self.held_in_doubt += row.held_in_doubt;
        self.restocked += row.restocked;
    }

    pub fn plus(self, other: Units) -> Units {
        Units {
            sold: self.sold + other.sold,
            released: self.released + other.released,
            pending: self.pending + other.pending,
            held_in_doubt: self.held_in_doubt + other.held_in_doubt,
            restocked: self.restocked + other.restocked,
        }
    }
}

/// One lane as read.
#[derive(Debug, Clone, Default)]
pub struct Lane {
    pub units: Units,
    /// Units of the versions on sale now left over the segments (`None`: no stock key).
    pub remaining: Option<i64>,
    /// When its last unit was taken (Redis time, unix ms), while none is left.
    pub sold_out_ms: Option<u64>,
    /// Redis holds anything of it (a ledger or a stock key).
    pub on_record: bool,
    /// A sale in phases: units taken in each phase (the ledger's `sold@<phase>`), over the
    /// segments of the version on sale.
    pub phase_sold: std::collections::BTreeMap<String, u64>,
}

/// The buyers seen in the records.
#[derive(Debug, Default)]
pub struct Buyers {
    confirmed: HashSet<u64>,
    pending: HashSet<u64>,
    /// The first reservation (Redis time, unix ms).
    pub first_sale_ms: Option<u64>,
}

impl Buyers {
    /// Distinct buyers holding a confirmed unit.
    pub fn bought(&self) -> u64 {
        self.confirmed.len() as u64
    }

    /// Whether `user` holds a unit, confirmed or still pending.
    pub fn holds(&self, user: &str) -> bool {
        let h = hash(user);
        self.confirmed.contains(&h) || self.pending.contains(&h)
    }
}

fn hash(user: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    user.hash(&mut h);
    h.finish()
}

/// Reads one lane: its ledgers, then its records into `timeline` and `buyers`.
pub async fn read_lane(
    store: &StockStore,
    lane: &Activity,
    timeline: &mut Timeline,
    buyers: &mut Buyers,
) -> Result<Lane, StoreError> {
    let layout = segments::recorded_layout(store, lane).await?;
    let mut out = Lane::default();
    let mut current_left: Option<i64> = None;
    let mut sold_out: Option<u64> = None;
    let mut current = Vec::new();
    for segment in layout.segments() {
        let meta = store.meta(segment).await?;
        let on_sale = meta.current;
        current.push(on_sale);
        for version in meta.versions {
            let row = store.ledger(segment, version).await?;
            out.on_record |= row.ledger || row.stock_key;
            out.units.add(&row);
            if Some(version) != on_sale {
                continue;
            }
            let extra = ledger_extras(store, &layout, segment.index(), version).await?;
            for (at, units) in extra.restocks {
                timeline.add(Count::UnitsBack, at, units);
            }
            if row.stock_key {
                *current_left.get_or_insert(0) += row.remaining;
            }
            sold_out = sold_out.max(extra.sold_out_ms);
            for (phase, units) in extra.phase_sold {
                *out.phase_sold.entry(phase).or_insert(0) += units;
            }
        }
    }
    out.remaining = current_left;
    out.sold_out_ms = sold_out.filter(|_| current_left == Some(0));
    for segment in layout.segments() {
        let on_sale = current[segment.index() as usize];
        let key = store.keys().of(segment).reservations();
        scan(store, &key, |_, raw| {
            if let Some(r) = ReservationRecord::parse(raw) {
                count(&r, on_sale, timeline, buyers);
            }
        })
        .await?;
    }
    Ok(out)
}

/// One record into the timeline and the buyers.
fn count(
    r: &ReservationRecord,
    on_sale: Option<u64>,
    timeline: &mut Timeline,
    buyers: &mut Buyers,
) {
    if r.tombstone {
        return;
    }
    let current = Some(r.ver) == on_sale;
    if let Some(at) = r.created_ms {
        timeline.add(Count::Reservations, at, 1);
        if current {
            timeline.add(Count::UnitsTaken, at, r.qty);
        }
        buyers.first_sale_ms = Some(buyers.first_sale_ms.map_or(at, |f| f.min(at)));
    }
    let done = r.done_ms.unwrap_or(0);
    match r.state {
        RecordState::Pending => {
            buyers.pending.insert(hash(&r.user));
        }
        RecordState::Confirmed => {
            timeline.add(Count::Confirmations, done, 1);
            buyers.confirmed.insert(hash(&r.user));
        }
        RecordState::Released => {
            timeline.add(Count::Releases, done, 1);
            if current && r.returned == Some(true) {
                timeline.add(Count::UnitsBack, done, r.qty);
            }
        }
    }
}

/// What the ledger keeps for the report beside its counts.
struct Extras {
    sold_out_ms: Option<u64>,
    /// (when, units) of each restock.
    restocks: Vec<(u64, u64)>,
    /// (phase, units) taken in each phase of a sale in phases.
    phase_sold: Vec<(String, u64)>,
}

async fn ledger_extras(
    store: &StockStore,
    layout: &Layout,
    segment: u32,
    version: u64,
) -> Result<Extras, StoreError> {
    let segment = layout.segment(segment).expect("a segment of the layout");
    let key = store.keys().of(segment).ledger(version);
    let fields: Vec<(String, String)> = store
        .redis()
        .query(StoreOp::Read, redis::cmd("HGETALL").arg(key))
        .await?;
    let mut extras = Extras {
        sold_out_ms: None,
        restocks: Vec::new(),
        phase_sold: Vec::new(),
    };
    for (field, value) in fields {
        if field == "sold_out_ms" {
            extras.sold_out_ms = value.parse().ok();
        } else if let Some(at) = field.strip_prefix("restock@") {
            if let (Ok(at), Ok(units)) = (at.parse(), value.parse()) {
                extras.restocks.push((at, units));
            }
        } else if let Some(phase) = field.strip_prefix("sold@") {
            if let Ok(units) = value.parse() {
                extras.phase_sold.push((phase.to_owned(), units));
            }
        }
    }
    Ok(extras)
}

/// Every field of hash `key`, a page at a time (HSCAN). Approximation during a sale: a field
/// added meanwhile may be missed, and a hash Redis resizes meanwhile may show a field twice
/// (HSCAN's guarantee); after the sale, with nothing written, each field is seen once.
pub async fn scan(
    store: &StockStore,
    key: &str,
    each: impl FnMut(&str, &str),
) -> Result<(), StoreError> {
    scan_matching(store, key, None, each).await
}

/// [`scan`] of the fields matching a glob `pattern` only (HSCAN MATCH).
pub async fn scan_matching(
    store: &StockStore,
    key: &str,
    pattern: Option<&str>,
    mut each: impl FnMut(&str, &str),
) -> Result<(), StoreError> {
    let mut cursor = "0".to_owned();
    loop {
        let mut cmd = redis::cmd("HSCAN");
        cmd.arg(key).arg(&cursor).arg("COUNT").arg(PAGE);
        if let Some(pattern) = pattern {
            cmd.arg("MATCH").arg(pattern);
        }
        let (next, page): (String, Vec<(String, String)>) =
            store.redis().query(StoreOp::Read, &cmd).await?;
        for (field, value) in &page {
            if !field.is_empty() {
                each(field, value);
            }
        }
        if next == "0" {
            return Ok(());
        }
        cursor = next;
    }
}
