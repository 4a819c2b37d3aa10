//! What the waiting room holds of a sale: its tickets (who queued, and at which number), when
//! each call issued them (the queue hash's `a:<first number>`, see `lua/queue_ticket.lua`; a
//! ticket's arrival is its number's call's time), when the cursor reached
//! each place (the queue's `log` of marks, or, stepped, `q:adm`), the challenges solved, and the
//! draw. A ticket is admitted once its place was reached; its wait runs from its issue to then.
//!
//! Memory: the issue times (a row per ticket call: fewer than the tickets, 16 bytes each), a
//! bitset of ticket numbers (one bit a number issued), stepped admission's admitted places (16
//! bytes each), and a histogram of waits (fixed size); the tickets are read a page at a time.
//!
//! Approximations: a queue an older flashgate set up has no `log`, only the last marks (`hist`):
//! a place reached before them counts as admitted with no wait known. Waits are kept to 3
//! significant digits (the histogram's precision). The draw's check reads the tickets whole, as
//! `flashgate draw` does (only for a sale with a pre-queue).

use super::sales::{scan, scan_matching, Buyers};
use super::timeline::{Count, Timeline};
use crate::config::Activity;
use crate::stock::{Layout, StockStore, StoreError, StoreOp};
use crate::waiting::draw::{self, Seed};
use crate::waiting::view::{parse_marks, reached_at, Mark};
use hdrhistogram::Histogram;
use std::collections::HashMap;

/// The waiting room's figures.
#[derive(Debug)]
pub struct Queue {
    pub queued: u64,
    pub admitted: u64,
    pub no_shows: u64,
    /// Ticket to turn, ms, of the admitted tickets whose issue time is known.
    pub waits: Histogram<u64>,
    pub challenges_solved: u64,
    /// When the queue started admitting (Redis time, unix ms): the sale's start, or the later
    /// one it was postponed to.
    pub start_ms: Option<u64>,
    /// `Some(true)` the draw verifies, `Some(false)` it differs, `None` no draw (yet).
    pub draw: Option<bool>,
}

/// The queue hash's fields the report reads (by name: the hash also holds a field per ticket
/// call).
const FIELDS: [&str; 8] = [
    "start", "seq", "drawn", "seed", "step", "solved", "log", "hist",
];

/// Those fields, parsed.
struct QueueHash {
    start_ms: Option<u64>,
    seq: u64,
    drawn: Option<(u64, Seed)>,
    stepped: bool,
    solved: u64,
    marks: Vec<Mark>,
}

impl QueueHash {
    /// The queue hash `key`'s fields; `None` if it has none (no waiting room on record).
    async fn read(store: &StockStore, key: &str) -> Result<Option<QueueHash>, StoreError> {
        let fields: Vec<Option<String>> = store
            .redis()
            .query(StoreOp::Read, redis::cmd("HMGET").arg(key).arg(&FIELDS[..]))
            .await?;
        if fields.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(QueueHash::parse(&fields)))
    }

    fn parse(f: &[Option<String>]) -> QueueHash {
        let get =
            |k: &str| f[FIELDS.iter().position(|x| *x == k).expect("a field read")].as_deref();
        let n = |k: &str| get(k).and_then(|v| v.parse::<u64>().ok());
        let drawn = match (n("drawn"), get("seed").and_then(draw::parse_seed)) {
            (Some(d), Some(seed)) => Some((d, seed)),
            _ => None,
        };
        let marks = get("log")
            .or(get("hist"))
            .and_then(parse_marks)
            .unwrap_or_default();
        QueueHash {
            start_ms: n("start"),
            seq: n("seq").unwrap_or(0),
            drawn,
            stepped: get("step") == Some("1"),
            solved: n("solved").unwrap_or(0),
            marks,
        }
    }
}

/// When each ticket call issued: (its first number, ms), by first number.
struct Arrivals(Vec<(u64, u64)>);

impl Arrivals {
    /// The time of the call that issued `number`: the last call whose first number is not
    /// above it (a number skipped between two calls was issued to nobody, so no ticket asks).
    fn issued_ms(&self, number: u64) -> Option<u64> {
        let i = self.0.partition_point(|(first, _)| *first <= number);
        Some(self.0.get(i.checked_sub(1)?)?.1)
    }
}

/// Reads `activity`'s waiting room as of Redis time `now_ms`; `None` if it has none on record.
pub async fn read(
    store: &StockStore,
    activity: &Activity,
    now_ms: u64,
    buyers: &Buyers,
    timeline: &mut Timeline,
) -> Result<Option<Queue>, StoreError> {
    let base = store.keys().base(&Layout::new(activity.id.clone(), 1));
    let Some(q) = QueueHash::read(store, &base.queue()).await? else {
        return Ok(None);
    };
    let arrivals = read_arrivals(store, &base.queue()).await?;
    let admitted_at = if q.stepped {
        let [_, adm, _] = base.queue_stepped();
        read_admitted(store, &adm).await?
    } else {
        HashMap::new()
    };
    let mut out = Queue {
        queued: 0,
        admitted: 0,
        no_shows: 0,
        waits: Histogram::new(3).expect("3 significant digits"),
        challenges_solved: q.solved,
        start_ms: q.start_ms,
        draw: None,
    };
    let mut seen = vec![0u64; (q.seq as usize + 64) / 64];
    scan(store, &base.queue_tickets(), |user, number| {
        let Ok(number) = number.parse::<u64>() else {
            return;
        };
        if let Some(bits) = seen.get_mut(number as usize / 64) {
            let bit = 1 << (number % 64);
            if *bits & bit != 0 {
                return;
            }
            *bits |= bit;
        }
        out.queued += 1;
        let issued = arrivals.issued_ms(number);
        if let Some(at) = issued {
            timeline.add(Count::Arrivals, at, 1);
        }
        let place = draw::place(
            number,
            q.drawn.map(|d| d.0),
            &q.drawn.map_or([0; 32], |d| d.1),
        );
        let reached = if q.stepped {
            admitted_at.get(&place).copied()
        } else {
            reached_at(&q.marks, place)
        };
        let Some(reached) = reached.filter(|&r| r <= now_ms) else {
            return;
        };
        out.admitted += 1;
        timeline.add(Count::Admissions, reached, 1);
        if let Some(issued) = issued {
            let _ = out.waits.record(reached.saturating_sub(issued));
        }
        if !buyers.holds(user) {
            out.no_shows += 1;
        }
    })
    .await?;
    if q.drawn.is_some_and(|(d, _)| d > 0) {
        out.draw = Some(
            crate::waiting::audit::audit(store, activity)
                .await?
                .matches(),
        );
    }
    Ok(Some(out))
}

/// Stepped admission: when each place was admitted (place -> ms; a turn given away is not).
async fn read_admitted(store: &StockStore, key: &str) -> Result<HashMap<u64, u64>, StoreError> {
    let mut admitted_at = HashMap::new();
    scan(store, key, |place, at| {
        if let (Ok(place), Ok(at)) = (place.parse(), at.parse()) {
            admitted_at.insert(place, at);
        }
    })
    .await?;
    Ok(admitted_at)
}

/// When each ticket call issued (the queue hash's `a:<first>` fields).
async fn read_arrivals(store: &StockStore, q: &str) -> Result<Arrivals, StoreError> {
    let mut arrivals = Vec::new();
    scan_matching(store, q, Some("a:*"), |field, at| {
        let first = field.strip_prefix("a:").and_then(|f| f.parse::<u64>().ok());
        if let (Some(first), Ok(at)) = (first, at.parse::<u64>()) {
            arrivals.push((first, at));
        }
    })
    .await?;
    arrivals.sort_unstable();
    arrivals.dedup_by_key(|a| a.0);
    Ok(Arrivals(arrivals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_is_issued_at_its_calls_time() {
        let a = Arrivals(vec![(1, 1_000), (4, 2_000), (9, 3_000)]);
        assert_eq!(a.issued_ms(1), Some(1_000));
        assert_eq!(a.issued_ms(3), Some(1_000));
        assert_eq!(a.issued_ms(4), Some(2_000));
        assert_eq!(a.issued_ms(10), Some(3_000));
        assert_eq!(a.issued_ms(0), None);
    }
}
