//! The records and ledgers the scripts keep, as Rust types (a reservation record, a segment's
//! meta, a ledger row), and the label enums they carry.

use crate::label_enum;
use redis::Value;
use serde::Serialize;

label_enum! {
    /// Why a reservation's units were given back: the record's `reason` and the metric label.
    pub enum ReleaseReason {
        /// The upstream answered 5xx.
        Upstream5xx => "upstream_5xx",
        /// The upstream could not be reached, timed out, or broke the connection.
        UpstreamError => "upstream_error",
        /// The stock store did not answer a reserve in time; the id is released in case it
        /// landed.
        StoreTimeout => "store_timeout",
        /// The hold deadline passed while the reservation was still pending.
        Expired => "expired",
        /// `POST .../release` (an order cancelled, unpaid, or refunded).
        Admin => "admin",
        /// The buyer's request turned out malformed after the reserve.
        BadRequest => "bad_request",
        /// The winner waited longer than `upstream.max_queue_wait_ms` for an upstream slot.
        QueueTimeout => "queue_timeout",
        /// The backend's order lookup said it holds no such order (`upstream.order_lookup`).
        OrderNotFound => "order_not_found",
    }
}

/// A reply value as a Rust type.
pub(crate) fn from<T: redis::FromRedisValue>(v: &Value) -> Result<T, super::StoreError> {
    Ok(redis::from_redis_value_ref(v).map_err(redis::RedisError::from)?)
}

pub(crate) fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

pub(crate) fn string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

label_enum! {
    /// What became of units the backend accepted after their reservation was released (the
    /// `outcome` label of `flashgate_late_accepted_units_total`).
    pub enum LateOutcome {
        /// A unit of the version's stock was taken to cover them.
        Covered => "covered",
        /// None was left: the version is oversold by them.
        Oversold => "oversold",
    }
}

label_enum! {
    /// Who confirmed a reservation (event field and metric label).
    pub enum ConfirmedVia {
        /// The upstream answered 2xx (activity `confirm: upstream`).
        Upstream => "upstream",
        /// `POST /v1/activities/{act}/reservations/{jti}/confirm`.
        Admin => "admin",
        /// The backend said it holds the order (`upstream.order_lookup`).
        Lookup => "lookup",
    }
}

/// One segment's meta: what is on sale, and every version it ever had.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentMeta {
    pub current: Option<u64>,
    /// Ascending.
    pub versions: Vec<u64>,
    /// On the base tag only: the segment count and newest version claimed.
    pub segments: Option<u32>,
    pub newest: Option<u64>,
    /// On the base tag of a segmented activity only: the segments made so far (`made:<n>`).
    pub made: Vec<u32>,
}

impl SegmentMeta {
    pub(super) fn parse(fields: Vec<(String, String)>) -> SegmentMeta {
        let mut meta = SegmentMeta::default();
        for (field, value) in fields {
            match field.as_str() {
                "current" => meta.current = value.parse().ok(),
                "segments" => meta.segments = value.parse().ok(),
                "version" => meta.newest = value.parse().ok(),
                f => {
                    if let Some(v) = f.strip_prefix("v:").and_then(|v| v.parse().ok()) {
                        meta.versions.push(v);
                    } else if let Some(n) = f.strip_prefix("made:").and_then(|n| n.parse().ok()) {
                        meta.made.push(n);
                    }
                }
            }
        }
        meta.versions.sort_unstable();
        meta
    }
}

/// Reservation states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    Pending,
    Confirmed,
    Released,
}

/// A reservation as the scripts record it
/// (`state|qty|ver|created|deadline|done|reason|flags|fence|prior|busy|user`, see `lua/lib.lua`;
/// a record an older flashgate wrote has no fence fields and no `f` flag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationRecord {
    pub state: RecordState,
    pub user: String,
    pub qty: u64,
    pub ver: u64,
    pub created_ms: Option<u64>,
    pub deadline_ms: Option<u64>,
    /// When it was confirmed or released.
    pub done_ms: Option<u64>,
    pub reason: Option<String>,
    /// An idempotent replay handed it to a second request.
    pub replayed: bool,
    /// Released units went back to stock (`Some(true)`) or were retired (`Some(false)`).
    pub returned: Option<bool>,
    /// The released marker written for an abandoned id that never reserved anything.
    pub tombstone: bool,
    /// Released, and then the backend accepted it anyway (counted once in the ledger).
    pub accepted_late: bool,
    /// Held in doubt (flag `d`, `lua/doubt.lua`): pending when an operator resumed its segment
    /// after a fence or a loss; its hold's expiry never releases it.
    pub in_doubt: bool,
    /// Its fence: moved by every forward and every hand-out to an order lookup.
    pub fence: u64,
    /// The phase it was bought in, on a sale in phases (flag `p`).
    pub phase: Option<String>,
}

impl ReservationRecord {
    pub fn parse(raw: &str) -> Option<ReservationRecord> {
        let mut parts = raw.splitn(9, '|');
        let mut next = || parts.next();
        let state = match next()? {
            "pending" => RecordState::Pending,
            "confirmed" => RecordState::Confirmed,
            "released" => RecordState::Released,
            _ => return None,
        };
        let number = |s: &str| -> Option<Option<u64>> {
            if s.is_empty() {
                Some(None)
            } else {
                s.parse().ok().map(Some)
            }
        };
        let qty = next()?.parse().ok()?;
        let ver = next()?.parse().ok()?;
        let created_ms = number(next()?)?;
        let deadline_ms = number(next()?)?;
        let done_ms = number(next()?)?;
        let reason = Some(next()?).filter(|r| !r.is_empty()).map(str::to_owned);
        let flags = next()?;
        let mut rest = next()?;
        let mut fence = 0;
        let mut phase = None;
        if flags.contains('f') {
            // With flag `p`, the phase follows the fence fields (a phase id holds no '|').
            let with_phase = flags.contains('p');
            let mut fields = rest.splitn(if with_phase { 5 } else { 4 }, '|');
            fence = fields.next()?.parse().ok()?;
            let _prior: u64 = fields.next()?.parse().ok()?;
            let _busy: u64 = fields.next()?.parse().ok()?;
            if with_phase {
                phase = Some(fields.next()?.to_owned()).filter(|p| !p.is_empty());
            }
            rest = fields.next()?;
        }
        let user = rest.to_owned();
        Some(ReservationRecord {
            state,
            user,
            qty,
            ver,
            created_ms,
            deadline_ms,
            done_ms,
            reason,
            replayed: flags.contains('r'),
            returned: if flags.contains('k') {
                Some(true)
            } else if flags.contains('x') {
                Some(false)
            } else {
                None
            },
            tombstone: flags.contains('t'),
            accepted_late: flags.contains('l'),
            in_doubt: flags.contains('d'),
            fence,
            phase,
        })
    }
}

/// The ledger fields as `lua/lib.lua`'s LEDGER_FIELDS lists them (the ledger script answers in
/// this order; a test keeps the two lists equal).
pub const LEDGER_FIELDS: [&str; 13] = [
    "initial",
    "pending",
    "confirmed",
    "released",
    "retired",
    "moved_in",
    "moved_out",
    "unsold_retired",
    "late_accepted",
    "oversold",
    "restocked",
    "recounted",
    "held_in_doubt",
];

/// One stock version's ledger in one segment, read atomically with its stock key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LedgerRow {
    pub version: u64,
    pub stock_key: bool,
    pub remaining: i64,
    pub initial: i64,
    pub pending: i64,
    pub confirmed: i64,
    pub released: i64,
    pub retired: i64,
    /// Units moved in from / out to other segments (rebalancing).
    pub moved_in: i64,
    pub moved_out: i64,
    /// The part of `retired` no reservation accounts for: stock left when a newer version went
    /// on sale here, and transfers arriving after that.
    pub unsold_retired: i64,
    /// Units the backend accepted after their reservation was released (each covered by a unit
    /// of stock, counted in `confirmed`, unless `oversold`): never clean.
    pub late_accepted: i64,
    /// The part of `late_accepted` no unit of stock was left to cover: sold twice.
    pub oversold: i64,
    /// Units an operator added to the version on sale (`POST .../restock`).
    pub restocked: i64,
    /// Units an operator's count took off sale (negative: put on sale) after the store forgot
    /// what it sold (`POST .../resume` with `{"remaining": N}`, `lua/recount.lua`).
    pub recounted: i64,
    /// The part of `pending` held in doubt (flag `d`, `lua/doubt.lua`): units, not
    /// reservations (a reservation of 3 units counts 3), of this version's reservations still
    /// pending whose hold's expiry will not release them. A counter the scripts keep (see
    /// `lua/lib.lua`), equal to the sum over the records (`flashgate reconcile` checks it), read
    /// without a scan; not a term of [`LedgerRow::drift`].
    pub held_in_doubt: i64,
    pub ledger: bool,
    pub pending_reservations: i64,
}

impl LedgerRow {
    /// Parses the ledger script's answer (see `lua/ledger.lua`).
    pub(super) fn parse(version: u64, r: &[i64]) -> Option<Self> {
        match *r {
            [stock_key, remaining, initial, pending, confirmed, released, retired, moved_in, moved_out, unsold_retired, late_accepted, oversold, restocked, recounted, held_in_doubt, ledger, pending_reservations] => {
                Some(LedgerRow {
                    version,
                    stock_key: stock_key == 1,
                    remaining,
                    initial,
                    pending,
                    confirmed,
                    released,
                    retired,
                    moved_in,
                    moved_out,
                    unsold_retired,
                    late_accepted,
                    oversold,
                    restocked,
                    recounted,
                    held_in_doubt,
                    ledger: ledger == 1,
                    pending_reservations,
                })
            }
            _ => None,
        }
    }

    /// The rows of one version summed over segments; `None` without rows.
    pub fn total(rows: &[&LedgerRow]) -> Option<LedgerRow> {
        let first = *rows.first()?;
        Some(rows.iter().skip(1).fold(*first, |t, r| LedgerRow {
            version: t.version,
            stock_key: t.stock_key || r.stock_key,
            remaining: t.remaining + r.remaining,
            initial: t.initial + r.initial,
            pending: t.pending + r.pending,
            confirmed: t.confirmed + r.confirmed,
            released: t.released + r.released,
            retired: t.retired + r.retired,
            moved_in: t.moved_in + r.moved_in,
            moved_out: t.moved_out + r.moved_out,
            unsold_retired: t.unsold_retired + r.unsold_retired,
            late_accepted: t.late_accepted + r.late_accepted,
            oversold: t.oversold + r.oversold,
            restocked: t.restocked + r.restocked,
            recounted: t.recounted + r.recounted,
            held_in_doubt: t.held_in_doubt + r.held_in_doubt,
            ledger: t.ledger || r.ledger,
            pending_reservations: t.pending_reservations + r.pending_reservations,
        }))
    }

    /// `initial + moved_in - moved_out + restocked` less `remaining + pending + confirmed +
    /// retired + recounted`: zero when every unit is accounted for. A version with no ledger
    /// and no stock key (never prewarmed, or expired with everything) has nothing to account
    /// for.
    pub fn drift(&self) -> i64 {
        if !self.ledger && !self.stock_key {
            return 0;
        }
        let remaining = if self.stock_key { self.remaining } else { 0 };
        self.initial + self.moved_in - self.moved_out + self.restocked
            - (remaining + self.pending + self.confirmed + self.retired + self.recounted)
    }

    /// Units this segment can still sell or is owed: its stock plus what it sent off that has
    /// not arrived anywhere yet. Summed over segments this is the version's stock plus the
    /// units in flight, whatever order the segments were read in (a withdraw or a deposit
    /// keeps each segment's figure as it was).
    pub fn available(&self) -> i64 {
        let remaining = if self.stock_key { self.remaining } else { 0 };
        remaining + self.moved_out - self.moved_in
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> LedgerRow {
        LedgerRow {
            version: 1,
            stock_key: true,
            remaining: 90,
            initial: 100,
            pending: 6,
            confirmed: 3,
            released: 5,
            retired: 1,
            moved_in: 0,
            moved_out: 0,
            unsold_retired: 0,
            late_accepted: 0,
            oversold: 0,
            restocked: 0,
            recounted: 0,
            held_in_doubt: 2,
            ledger: true,
            pending_reservations: 6,
        }
    }

    #[test]
    fn ledger_drift() {
        let row = row();
        assert_eq!(row.drift(), 0);
        assert_eq!(
            LedgerRow {
                remaining: 91,
                ..row
            }
            .drift(),
            -1,
            "a unit from nowhere"
        );
        assert_eq!(
            LedgerRow {
                confirmed: 2,
                ..row
            }
            .drift(),
            1,
            "a lost unit"
        );
        let gone = LedgerRow {
            stock_key: false,
            ledger: false,
            ..row
        };
        assert_eq!(gone.drift(), 0);
        let stock_removed = LedgerRow {
            stock_key: false,
            remaining: 0,
            ..row
        };
        assert_eq!(stock_removed.drift(), 90);
    }

    #[test]
    fn availability_is_kept_by_transfers_in_any_read_order() {
        let giver = row();
        let receiver = row();
        let before = giver.available() + receiver.available();
        // Withdraw 10 from the giver (read after), receiver not yet deposited (read before).
        let giver_after = LedgerRow {
            remaining: 80,
            moved_out: 10,
            ..giver
        };
        assert_eq!(giver_after.available() + receiver.available(), before);
        let receiver_after = LedgerRow {
            remaining: 100,
            moved_in: 10,
            ..receiver
        };
        assert_eq!(giver_after.available() + receiver_after.available(), before);
    }

    #[test]
    fn records_parse_exactly() {
        let rec = ReservationRecord::parse(
            "released|2|123456789012345678|1733040000123|1733040900123|1733040000200|admin|rk|a|b",
        )
        .unwrap();
        assert_eq!(rec.state, RecordState::Released);
        assert_eq!((rec.qty, rec.ver), (2, 123_456_789_012_345_678));
        assert_eq!(rec.user, "a|b", "the user id comes last and may hold '|'");
        assert_eq!(
            (rec.replayed, rec.returned, rec.tombstone),
            (true, Some(true), false)
        );
        let tomb = ReservationRecord::parse("released|0|1|||17|store_timeout|t|").unwrap();
        assert!(tomb.tombstone);
        assert_eq!(tomb.created_ms, None);
        for bad in [
            "",
            "pending|x|1||||||u",
            "gone|1|1||||||u",
            "pending|1|1|||",
        ] {
            assert!(ReservationRecord::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn ledger_fields_match_lib_lua() {
        let lib = include_str!("../../lua/lib.lua");
        let line = lib
            .lines()
            .skip_while(|l| !l.starts_with("local LEDGER_FIELDS"))
            .take_while(|l| !l.trim_end().ends_with('}'))
            .chain(
                lib.lines()
                    .skip_while(|l| !l.starts_with("local LEDGER_FIELDS"))
                    .skip_while(|l| !l.trim_end().ends_with('}'))
                    .take(1),
            )
            .collect::<String>();
        let listed: Vec<&str> = line.split('\'').skip(1).step_by(2).collect();
        assert_eq!(listed, LEDGER_FIELDS);
    }
}
