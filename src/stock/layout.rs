//! Where an activity's stock lives in Redis: one segment, or `segments` segments, each under
//! a hash tag of its own so that Redis Cluster spreads them over masters. Every buyer has a home
//! segment holding their units, reservations and idempotency keys, so the per-user limit is
//! checked in the same atomic step as the deduction.
//!
//! The segment count is fixed for the life of an activity's keys (recorded in Redis when it is
//! first prewarmed; see `claim.lua`): a buyer's home must never move, or their units and
//! idempotency keys would be left behind in another segment. The count is part of every
//! segment's tag (`{<id>~<n>/<count>}`), so an instance configured with another count finds no
//! stock key at all (and its prewarm is refused by the claim) instead of selling from a layout
//! whose buyers live elsewhere.
//!
//! A variant of a drop is a stock lane of its own under the activity's tags: its stock, ledger,
//! records and fence keys carry the variant (`:~<variant>` after the tag), while the buyers'
//! units and idempotency keys (and the activity's halt and waiting room) stay the activity's,
//! so one script checks the per-user limit across every variant with the variant's stock.

use crate::config::Activity;
use std::sync::Arc;

/// One activity's segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    id: Arc<str>,
    segments: u32,
    /// The variant whose stock lane this is (`None`: the activity's own).
    variant: Option<Arc<str>>,
    /// The lane's name in memory (`Activity::lane`): the id, or `<id>~<variant>`.
    lane: Arc<str>,
}

/// One segment of an activity: hash tag `{<id>}` when it has one, `{<id>~<n>/<count>}` when
/// several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<'a> {
    layout: &'a Layout,
    index: u32,
}

impl Layout {
    pub fn new(id: Arc<str>, segments: u32) -> Layout {
        Layout {
            lane: id.clone(),
            id,
            segments: segments.max(1),
            variant: None,
        }
    }

    /// The layout an activity's configuration asks for (of its variant's lane, for a lane).
    pub fn of(activity: &Activity) -> Layout {
        Layout {
            variant: activity.variant.clone(),
            lane: activity.lane.clone(),
            ..Layout::new(activity.id.clone(), activity.segments)
        }
    }

    /// The layout of the stock lane named `lane` (`Activity::lane`: `<id>`, or
    /// `<id>~<variant>`) with `segments` segments.
    pub fn of_lane(lane: &str, segments: u32) -> Layout {
        match lane.split_once('~') {
            Some((id, variant)) => {
                Layout::new(Arc::from(id), segments).for_variant(Arc::from(variant))
            }
            None => Layout::new(Arc::from(lane), segments),
        }
    }

    /// This layout for a variant's stock lane.
    pub fn for_variant(self, variant: Arc<str>) -> Layout {
        Layout {
            lane: Arc::from(format!("{}~{variant}", self.id)),
            variant: Some(variant),
            ..self
        }
    }

    /// The lane's name in memory (`Activity::lane`).
    pub fn lane(&self) -> &Arc<str> {
        &self.lane
    }

    /// The variant whose stock lane this is.
    pub fn variant(&self) -> Option<&Arc<str>> {
        self.variant.as_ref()
    }

    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// How many segments (1 for an activity that is not segmented).
    pub fn count(&self) -> u32 {
        self.segments
    }

    pub fn is_segmented(&self) -> bool {
        self.segments > 1
    }

    pub fn segment(&self, index: u32) -> Option<Segment<'_>> {
        (index < self.segments).then_some(Segment {
            layout: self,
            index,
        })
    }

    pub fn segments(&self) -> impl Iterator<Item = Segment<'_>> {
        (0..self.segments).map(|index| Segment {
            layout: self,
            index,
        })
    }

    /// A buyer's home segment: FNV-1a (64 bit) of the user id, the same on every instance and
    /// release (unlike std's per-process RandomState).
    pub fn home(&self, user: &str) -> Segment<'_> {
        let hash = stable_hash(user);
        Segment {
            layout: self,
            index: (hash % u64::from(self.segments)) as u32,
        }
    }

    /// The units segment `index` starts a version with: the stock split evenly, the first
    /// `stock % segments` taking one unit more.
    pub fn share(&self, stock: u64, index: u32) -> u64 {
        let n = u64::from(self.segments);
        stock / n + u64::from(u64::from(index) < stock % n)
    }
}

/// FNV-1a (64 bit) of `s`: the same on every instance and release (unlike std's per-process
/// RandomState), for what every gateway must place alike.
pub fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl<'a> Segment<'a> {
    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn layout(&self) -> &'a Layout {
        self.layout
    }

    /// The hash tag's content.
    pub fn tag(&self) -> String {
        if self.layout.is_segmented() {
            format!("{}~{}/{}", self.layout.id, self.index, self.layout.segments)
        } else {
            self.layout.id.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_homes_and_shares() {
        let one = Layout::new(Arc::from("1001"), 1);
        assert_eq!(one.home("alice").tag(), "1001");
        let six = Layout::new(Arc::from("1001"), 6);
        assert_eq!(six.segment(5).unwrap().tag(), "1001~5/6");
        assert!(six.segment(6).is_none());
        // Stable across processes: pinned values.
        assert_eq!(six.home("alice").index(), six.home("alice").index());
        let homes: std::collections::HashSet<u32> = (0..200)
            .map(|i| six.home(&format!("u{i}")).index())
            .collect();
        assert_eq!(homes.len(), 6, "buyers spread over every segment");
        let shares: Vec<u64> = (0..6).map(|i| six.share(1000, i)).collect();
        assert_eq!(shares, [167, 167, 167, 167, 166, 166]);
        assert_eq!(shares.iter().sum::<u64>(), 1000);
    }
}
