//! The sale second by second: what happened in each second (Redis's clock), counted while the
//! records are read. Memory is one row per second in which anything happened (bounded by the
//! sale's length, not by its buyers); the charts merge seconds into wider steps when a sale ran
//! longer than they can show ([`Timeline::steps`]).

use std::collections::BTreeMap;

/// What is counted per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Tickets issued (buyers arriving at the waiting room).
    Arrivals,
    /// Tickets whose turn came.
    Admissions,
    /// Reservations made (units taken).
    Reservations,
    /// Reservations confirmed (sold).
    Confirmations,
    /// Reservations released (given back).
    Releases,
    /// Units of the versions on sale now taken (for the stock over time).
    UnitsTaken,
    /// Units of the versions on sale now given back to their stock, or restocked.
    UnitsBack,
}

const COUNTS: usize = 7;

/// One row: the counts of one second (or step).
pub type Row = [u64; COUNTS];

/// Counts per second (unix seconds).
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    seconds: BTreeMap<i64, Row>,
}

impl Timeline {
    /// Adds `n` to `what` in the second holding `at_ms`.
    pub fn add(&mut self, what: Count, at_ms: u64, n: u64) {
        let second = (at_ms / 1000) as i64;
        self.seconds.entry(second).or_default()[what as usize] += n;
    }

    /// The first and last second with anything counted.
    pub fn span(&self) -> Option<(i64, i64)> {
        Some((
            *self.seconds.keys().next()?,
            *self.seconds.keys().next_back()?,
        ))
    }

    /// The total of one count.
    pub fn total(&self, what: Count) -> u64 {
        self.seconds.values().map(|r| r[what as usize]).sum()
    }

    /// The timeline from `from` to `to` (unix seconds, inclusive) in at most `max` steps of
    /// equal length (whole seconds): each step's start and counts, empty seconds included.
    pub fn steps(&self, from: i64, to: i64, max: usize) -> (i64, Vec<(i64, Row)>) {
        let len = (to - from + 1).max(1);
        let step = ((len as usize).div_ceil(max.max(1))).max(1) as i64;
        let mut out: Vec<(i64, Row)> = (0..len.div_euclid(step) + i64::from(len % step != 0))
            .map(|i| (from + i * step, [0; COUNTS]))
            .collect();
        for (second, row) in self.seconds.range(from..=to) {
            let slot = &mut out[((second - from) / step) as usize].1;
            for (a, b) in slot.iter_mut().zip(row) {
                *a += b;
            }
        }
        (step, out)
    }
}

/// Units remaining at the end of each step, walked back from `now_remaining` (the ledgers' now):
/// a step's end holds what the next step began with.
pub fn remaining_by_step(steps: &[(i64, Row)], now_remaining: i64) -> Vec<i64> {
    let mut out = vec![0; steps.len()];
    let mut after = now_remaining;
    for (i, (_, row)) in steps.iter().enumerate().rev() {
        out[i] = after;
        after =
            after + row[Count::UnitsTaken as usize] as i64 - row[Count::UnitsBack as usize] as i64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_merge_seconds_and_keep_empty_ones() {
        let mut t = Timeline::default();
        t.add(Count::Reservations, 10_500, 2);
        t.add(Count::Reservations, 11_000, 1);
        t.add(Count::Releases, 14_999, 1);
        assert_eq!(t.span(), Some((10, 14)));
        let (step, rows) = t.steps(10, 14, 10);
        assert_eq!(step, 1);
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[0].1[Count::Reservations as usize], 2);
        assert_eq!(rows[2].1, [0; COUNTS]);
        let (step, rows) = t.steps(10, 14, 2);
        assert_eq!((step, rows.len()), (3, 2));
        assert_eq!(rows[0].1[Count::Reservations as usize], 3);
        assert_eq!(rows[1].1[Count::Releases as usize], 1);
        assert_eq!(t.total(Count::Reservations), 3);
    }

    #[test]
    fn remaining_walks_back_from_now() {
        let mut t = Timeline::default();
        t.add(Count::UnitsTaken, 1_000, 5);
        t.add(Count::UnitsBack, 2_000, 1);
        t.add(Count::UnitsTaken, 3_000, 1);
        let (_, rows) = t.steps(1, 3, 10);
        // Began with 10: 5 taken (5), 1 back (6), 1 taken (5).
        assert_eq!(remaining_by_step(&rows, 5), vec![5, 6, 5]);
    }
}
