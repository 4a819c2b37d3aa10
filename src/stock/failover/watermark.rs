//! What this process saw a segment hold: the most reservation records a reserve reply showed it
//! holding when this process acknowledged a sale there (a reservation made, or handed out
//! again), and of which life. A segment's `res` hash only ever grows within a life (its
//! placeholder names the life: see `records_of` in `lua/lib.lua`), so a store that later holds
//! fewer records of that life forgot what it had acknowledged (an older snapshot, a replica that
//! missed writes): the reserve script refuses such a segment at once (fenced), and the master
//! check (`lua/master.lua`) marks it lost and writes the count back beside it, so that every
//! gateway and `reconcile` can see it too.
//!
//! A count of another life says nothing: the records were made again (an emptied Redis, whose
//! loss the versions seen on sale tell, see [`super::Failover::was_on_sale`]), or an operator's
//! recount or a newer version started a new life.

/// The count kept for one segment (see the module doc).
#[derive(Default)]
pub struct Watermark(parking_lot::Mutex<Mark>);

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Mark {
    life: String,
    most: u64,
    /// The newest version of a sale acknowledged in this life.
    version: u64,
}

impl Watermark {
    /// A reserve reply that acknowledged a sale of `version` showed the segment holding `held`
    /// records of `life`. A count of a newer life replaces the one kept (the segment's records started a
    /// new life since); one of an older life is ignored (lives are ordered: see `older` in
    /// `lua/lib.lua`; the scripts refuse a segment gone back to one).
    pub fn saw(&self, life: &str, held: u64, version: u64) {
        let mut mark = self.0.lock();
        if mark.life == life {
            mark.most = mark.most.max(held);
            mark.version = mark.version.max(version);
        } else if !older(life, &mark.life) {
            *mark = Mark {
                life: life.to_owned(),
                most: held,
                version,
            };
        }
    }

    /// The newest version of a sale acknowledged in the life [`Self::seen`] names (0: none).
    pub fn version(&self) -> u64 {
        self.0.lock().version
    }

    /// What a reserve passes (the fencing token): the most records seen, their life, and the
    /// newest version of a sale acknowledged in it, read together.
    pub fn token(&self) -> (u64, String, u64) {
        let mark = self.0.lock();
        (mark.most, mark.life.clone(), mark.version)
    }

    /// The most records seen, and their life.
    pub fn seen(&self) -> (u64, String) {
        let mark = self.0.lock();
        (mark.most, mark.life.clone())
    }
}

/// Whether life `a` is older than life `b` (as `older` in `lua/lib.lua`: Redis TIME in us, of
/// one width, so compared as strings; '' is older than any).
pub(super) fn older(a: &str, b: &str) -> bool {
    (a.len(), a) < (b.len(), b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_seen_of_the_latest_life() {
        let w = Watermark::default();
        assert_eq!(w.seen(), (0, String::new()));
        w.saw("a", 10, 1);
        w.saw("a", 4, 2);
        assert_eq!(
            w.seen(),
            (10, "a".to_owned()),
            "never lowered within a life"
        );
        assert_eq!(w.version(), 2, "the newest version sold in the life");
        w.saw("b", 3, 1);
        assert_eq!(
            w.seen(),
            (3, "b".to_owned()),
            "a new life starts the count again"
        );
        assert_eq!(w.version(), 1);
        w.saw("a", 12, 3);
        assert_eq!(w.seen(), (3, "b".to_owned()), "an older life is ignored");
        assert_eq!(w.version(), 1);
    }
}
