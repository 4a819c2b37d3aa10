//! A buyer's steps through a sale in phases: from each start (unix ms, Redis's clock) the most
//! units they may hold and the phase they buy in, as the reserve script reads them (`a[13]` in
//! `lua/reserve.lua`). The script picks the step in force by its own clock; the gateway picks
//! the same one from the reservation's `created` time, with [`Steps::at`], to name the phase.

use std::fmt::Write;

/// A buyer's steps, in order of start; encoded once, when made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Steps {
    encoded: String,
}

impl Steps {
    /// Steps from `(start_ms, limit, phase)` in order of start. A phase id holds letters,
    /// digits, `-` and `_` only (the configuration's rule), so the encoding needs no escape.
    pub fn new<'p>(steps: impl IntoIterator<Item = (i64, u32, &'p str)>) -> Steps {
        let mut encoded = String::new();
        for (start_ms, limit, phase) in steps {
            if !encoded.is_empty() {
                encoded.push(' ');
            }
            let _ = write!(encoded, "{} {limit} {phase}", start_ms.max(0));
        }
        Steps { encoded }
    }

    /// As the reserve script reads it.
    pub fn encoded(&self) -> &str {
        &self.encoded
    }

    fn each(&self) -> impl Iterator<Item = (i64, u32, &str)> {
        let mut words = self.encoded.split(' ');
        std::iter::from_fn(move || {
            let start = words.next()?.parse().ok()?;
            let limit = words.next()?.parse().ok()?;
            Some((start, limit, words.next()?))
        })
    }

    /// The limit and the phase in force at `ms` (the script's rule): the last step started by
    /// then; `None` before the first.
    pub fn at(&self, ms: i64) -> Option<(u32, &str)> {
        self.each()
            .take_while(|&(start, _, _)| start <= ms)
            .last()
            .map(|(_, limit, phase)| (limit, phase))
    }

    /// When the first step starts: the buyer's opening.
    pub fn opens_ms(&self) -> Option<i64> {
        self.each().next().map(|(start, _, _)| start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_in_force_is_the_last_one_started() {
        let steps = Steps::new([(100, 1, "members"), (200, 2, "public")]);
        assert_eq!(steps.encoded(), "100 1 members 200 2 public");
        assert_eq!(steps.at(99), None);
        assert_eq!(steps.at(100), Some((1, "members")));
        assert_eq!(steps.at(199), Some((1, "members")));
        assert_eq!(steps.at(200), Some((2, "public")));
        assert_eq!(steps.opens_ms(), Some(100));
        assert_eq!(Steps::default().at(0), None);
    }
}
