//! The cursor's history: marks of where it stood and how fast it ran from when (the queue
//! hash's `hist`, and its `log` of every mark for `flashgate report`; see
//! `lua/queue_lib.lua`), and when a place was reached by them.

/// From `at_ms` on, the cursor was at `cursor`, moving at `rate` places a second if `running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub at_ms: u64,
    pub cursor: u64,
    pub rate: u64,
    pub running: bool,
    /// The sale was postponed at this time, the cursor standing from then until `at_ms`.
    pub postponed_at: Option<u64>,
}

impl Mark {
    pub(super) fn parse(raw: &str) -> Option<Mark> {
        let mut f = raw.split(',');
        let mut n = || f.next().map(|v| v.parse::<u64>().ok());
        let (at_ms, cursor, rate, running) = (n()??, n()??, n()??, n()??);
        let postponed_at = match n() {
            None => None,
            Some(p) => Some(p?),
        };
        Some(Mark {
            at_ms,
            cursor,
            rate: rate.max(1),
            running: running == 1,
            postponed_at,
        })
    }
}

/// When the cursor reached `place` by a history of `marks` (oldest first; Redis time, unix ms,
/// possibly still to come if the last mark runs): from the newest mark the place lies beyond,
/// while the cursor ran from it; `None` if it stood there (not reached), or no mark tells.
pub fn reached_at(marks: &[Mark], place: u64) -> Option<u64> {
    let mark = marks.iter().rev().find(|m| m.cursor < place)?;
    if !mark.running {
        return None;
    }
    Some(mark.at_ms + ((place - mark.cursor) * 1000).div_ceil(mark.rate))
}

/// Parses a `;`-separated history of marks (the queue hash's `hist` or `log`).
pub fn parse_marks(raw: &str) -> Option<Vec<Mark>> {
    raw.split(';')
        .filter(|m| !m.is_empty())
        .map(Mark::parse)
        .collect()
}
