//! What a segment's `known` hash says (see `lua/master.lua`), read for `reconcile` and the
//! admin view: whether the store was found to hold less than was sold, and by how much.

use super::super::{Segment, StockStore, StoreError, StoreOp};

/// One segment's record of what the gateways know it must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// The master record: the accepted identity, `lost`, or none.
    pub record: Option<String>,
    /// The reservation records the segment holds now (0 when its `res` hash is gone).
    pub held: u64,
    /// The most any gateway wrote back that it saw the segment hold when it acknowledged a
    /// sale (of the records' life now, or, if none, of another one).
    pub seen: u64,
    /// Why the segment was found lost, and when (unix ms), if it was.
    pub lost: Option<(String, u64)>,
    /// The operator's count of the last recount, if any.
    pub recount: Option<u64>,
    /// When a gateway first saw the fence standing now (Redis ms), if one stands: no resume,
    /// recount or rule lifted it yet.
    pub fenced_at: Option<u64>,
    /// Hashes of the segment (made: its meta exists) that lost their placeholder, so lost
    /// entries too (evicted, deleted, removed by hand): `res`, `users`.
    pub unmarked: Vec<&'static str>,
}

impl Known {
    /// Whether a store event left what the segment holds in doubt and no one settled it yet:
    /// it is fenced or lost now. What is pending there may be a sale the store forgot.
    pub fn in_doubt(&self) -> bool {
        self.fenced_at.is_some() || self.lost.is_some() || self.record.as_deref() == Some("lost")
    }

    /// Reservation records some gateway saw that the segment no longer holds.
    pub fn behind_by(&self) -> u64 {
        self.seen.saturating_sub(self.held)
    }
}

impl StockStore {
    /// Reads `segment`'s record of what it must hold (one MULTI/EXEC).
    pub async fn known(&self, segment: Segment<'_>) -> Result<Known, StoreError> {
        let keys = self.keys.of(segment);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("GET")
            .arg(keys.master())
            .cmd("HGETALL")
            .arg(keys.known())
            .cmd("HGET")
            .arg(keys.reservations())
            .arg("")
            .cmd("HLEN")
            .arg(keys.reservations())
            .cmd("EXISTS")
            .arg(keys.meta())
            .cmd("HEXISTS")
            .arg(keys.users())
            .arg("");
        type Reply = (
            Option<String>,
            Vec<(String, String)>,
            Option<String>,
            u64,
            bool,
            bool,
        );
        let (record, fields, life, held, made, users_marked): Reply = self
            .redis
            .pipeline(StoreOp::Read, self.timeout(), &pipe, None)
            .await?;
        let marked = life.is_some();
        let unmarked = [("res", marked), ("users", users_marked)]
            .into_iter()
            .filter(|(_, marked)| made && !marked)
            .map(|(name, _)| name)
            .collect();
        let field = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let lost = field("lost").map(|raw| {
            // '<version>|<reason>|<held>|<hw>|<at>'
            let parts: Vec<&str> = raw.split('|').collect();
            let reason = parts.get(1).copied().unwrap_or("lost").to_owned();
            let at = parts.get(4).and_then(|a| a.parse().ok()).unwrap_or(0);
            (reason, at)
        });
        Ok(Known {
            record,
            held: if marked { held } else { 0 },
            seen: field("hw")
                .and_then(|hw| seen_of(hw, life.as_deref().unwrap_or("")))
                .unwrap_or(0),
            lost,
            recount: field("recount")
                .and_then(|r| r.split('|').next())
                .and_then(|n| n.parse().ok()),
            fenced_at: field("fenced_at").and_then(|at| at.parse().ok()),
            unmarked,
        })
    }
}

/// The count a `hw` field ('<life>|<n>') says the records must hold, given the life they hold
/// now (`''`: gone). A count of an older life says nothing: a recount or a newer version started
/// the one held now (as `write_back` in `lua/master.lua`).
fn seen_of(hw: &str, life: &str) -> Option<u64> {
    let (hw_life, n) = hw.rsplit_once('|')?;
    if !life.is_empty() && super::watermark::older(hw_life, life) {
        return None;
    }
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::seen_of;

    #[test]
    fn a_count_of_an_older_life_says_nothing() {
        assert_eq!(seen_of("100|5", "100"), Some(5));
        assert_eq!(
            seen_of("100|5", ""),
            Some(5),
            "records gone: the count stands"
        );
        assert_eq!(
            seen_of("200|5", "100"),
            Some(5),
            "went back to an older life"
        );
        assert_eq!(seen_of("100|5", "200"), None, "a new life since");
        assert_eq!(seen_of("garbage", "100"), None);
    }
}
