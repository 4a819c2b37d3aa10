//! What the waiting room holds of a sale: its tickets (who queued, and at which number), when
//! each call issued them (`q:arrivals`, see `lua/queue_ticket.lua`), when the cursor reached
//! each place (the queue's `log` of marks, or, stepped, `q:adm`), the challenges solved, and the
//! draw. A ticket is admitted once its place was reached; its wait runs from its issue to then.
//!
//! Memory: the issue times (a row per ticket call: fewer than the tickets, 24 bytes each), a
//! bitset of ticket numbers (one bit a number issued), stepped admission's admitted places (16
//! bytes each), and a histogram of waits (fixed size); the tickets are read a page at a time.
//!
//! Approximations: a queue an older flashgate set up has no `log`, only the last marks (`hist`):
//! a place reached before them counts as admitted with no wait known. Waits are kept to 3
//! significant digits (the histogram's precision). The draw's check reads the tickets whole, as
//! `flashgate draw` does (only for a sale with a pre-queue).

use super::sales::{scan, Buyers};
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

/// The queue hash's fields the report reads.
struct QueueHash {
    start_ms: Option<u64>,
    seq: u64,
    drawn: Option<(u64, Seed)>,
    stepped: bool,
    solved: u64,
    marks: Vec<Mark>,
}

impl QueueHash {
    fn parse(f: &HashMap<String, String>) -> QueueHash {
        let n = |k: &str| f.get(k).and_then(|v| v.parse::<u64>().ok());
        let drawn = match (n("drawn"), f.get("seed").and_then(|s| draw::parse_seed(s))) {
            (Some(d), Some(seed)) => Some((d, seed)),
            _ => None,
        };
        let marks = f
            .get("log")
            .or(f.get("hist"))
            .and_then(|raw| parse_marks(raw))
            .unwrap_or_default();
        QueueHash {
            start_ms: n("start"),
            seq: n("seq").unwrap_or(0),
            drawn,
            stepped: f.get("step").is_some_and(|s| s == "1"),
            solved: n("solved").unwrap_or(0),
            marks,
        }
    }
}

/// When each ticket call issued: (first number, ms, count), by first number.
struct Arrivals(Vec<(u64, u64, u64)>);

impl Arrivals {
    fn issued_ms(&self, number: u64) -> Option<u64> {
        let i = self.0.partition_point(|(first, _, _)| *first <= number);
        let (first, at, count) = *self.0.get(i.checked_sub(1)?)?;
        (number < first + count).then_some(at)
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
    let fields: HashMap<String, String> = store
        .redis()
        .query(StoreOp::Read, redis::cmd("HGETALL").arg(base.queue()))
        .await?;
    if fields.is_empty() {
        return Ok(None);
    }
    let q = QueueHash::parse(&fields);
    let arrivals = read_arrivals(store, &base.queue_arrivals(), timeline).await?;
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
        if let Some(issued) = arrivals.issued_ms(number) {
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

/// The tickets' issue times, each call's count added to the arrivals per second.
async fn read_arrivals(
    store: &StockStore,
    key: &str,
    timeline: &mut Timeline,
) -> Result<Arrivals, StoreError> {
    let mut arrivals = Vec::new();
    scan(store, key, |first, value| {
        let mut v = value.split(',').map(str::parse::<u64>);
        if let (Ok(first), Some(Ok(at)), Some(Ok(count))) = (first.parse(), v.next(), v.next()) {
            arrivals.push((first, at, count));
        }
    })
    .await?;
    arrivals.sort_unstable();
    arrivals.dedup();
    for (_, at, count) in &arrivals {
        timeline.add(Count::Arrivals, *at, *count);
    }
    Ok(Arrivals(arrivals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_is_issued_at_its_calls_time() {
        let a = Arrivals(vec![(1, 1_000, 3), (4, 2_000, 1), (9, 3_000, 2)]);
        assert_eq!(a.issued_ms(1), Some(1_000));
        assert_eq!(a.issued_ms(3), Some(1_000));
        assert_eq!(a.issued_ms(4), Some(2_000));
        // Skipped numbers (the cursor ran past everyone) were issued to nobody.
        assert_eq!(a.issued_ms(5), None);
        assert_eq!(a.issued_ms(10), Some(3_000));
        assert_eq!(a.issued_ms(11), None);
        assert_eq!(a.issued_ms(0), None);
    }
}
