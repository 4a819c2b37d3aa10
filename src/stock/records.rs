//! What the scripts answer, and the records and ledgers they keep, as Rust types.

use redis::Value;
use serde::{Deserialize, Serialize};

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    Reserved {
        remaining: u64,
    },
    /// The buyer's `Idempotency-Key` already won this (not released) reservation.
    Replayed {
        id: String,
        qty: u32,
        version: u64,
        /// Units left in the current version, if its key exists.
        remaining: Option<u64>,
    },
    /// The stock key of this version does not exist (not prewarmed, or lost).
    NoStockKey,
    Insufficient {
        remaining: u64,
    },
    LimitExceeded {
        held: u64,
    },
    /// The reservation id exists already (a tombstone of an abandoned attempt).
    DuplicateId,
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl ReserveOutcome {
    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let at = |i: usize| int(reply.get(i));
        let unsigned = |i: usize| at(i).map(|v| v.max(0) as u64);
        Some(match at(0)? {
            1 => ReserveOutcome::Reserved {
                remaining: unsigned(1)?,
            },
            2 => ReserveOutcome::Replayed {
                remaining: at(1).and_then(|r| u64::try_from(r).ok()),
                qty: u32::try_from(at(2)?).ok()?,
                id: string(reply.get(3))?,
                version: u64::try_from(at(4)?).ok()?,
            },
            -1 => ReserveOutcome::NoStockKey,
            -2 => ReserveOutcome::Insufficient {
                remaining: unsigned(1)?,
            },
            -3 => ReserveOutcome::LimitExceeded { held: unsigned(2)? },
            -4 => ReserveOutcome::DuplicateId,
            _ => return None,
        })
    }
}

/// What the release script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Units returned; `remaining` is `None` when the version's stock key no longer exists (the
    /// units are then counted as retired: stock is never created from nothing).
    Released {
        remaining: Option<u64>,
    },
    AlreadyReleased,
    Unknown,
    VersionMismatch,
}

impl ReleaseOutcome {
    pub(super) fn parse(reply: &[i64]) -> Option<Self> {
        Some(match (reply.first()?, reply.get(1)?) {
            (1, remaining) => ReleaseOutcome::Released {
                remaining: u64::try_from(*remaining).ok(),
            },
            (0, _) => ReleaseOutcome::AlreadyReleased,
            (-1, _) => ReleaseOutcome::Unknown,
            (-2, _) => ReleaseOutcome::VersionMismatch,
            _ => return None,
        })
    }
}

/// What the confirm script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmOutcome {
    Confirmed,
    AlreadyConfirmed,
    /// Too late: the reservation was released (cancelled, failed or expired).
    Released,
    Unknown,
    VersionMismatch,
}

impl ConfirmOutcome {
    pub(super) fn parse(reply: i64) -> Option<Self> {
        Some(match reply {
            1 => ConfirmOutcome::Confirmed,
            0 => ConfirmOutcome::AlreadyConfirmed,
            -1 => ConfirmOutcome::Unknown,
            -2 => ConfirmOutcome::VersionMismatch,
            -3 => ConfirmOutcome::Released,
            _ => return None,
        })
    }
}

/// Who confirmed a reservation (event field and metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmedVia {
    /// The upstream answered 2xx (activity `confirm: upstream`).
    Upstream,
    /// `POST /v1/activities/{act}/reservations/{jti}/confirm`.
    Admin,
}

impl ConfirmedVia {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfirmedVia::Upstream => "upstream",
            ConfirmedVia::Admin => "admin",
        }
    }
}

/// What one sweep call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepOutcome {
    pub released: u64,
    pub units: u64,
    /// Due entries looked at; a full batch means more may be due.
    pub scanned: u64,
    /// Released reservations whose version's stock key was gone (units retired).
    pub retired: u64,
}

/// What prewarm found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrewarmOutcome {
    Created,
    Exists,
    /// The version's ledger exists but its stock key is gone (removed by hand, or lost): it is
    /// not re-created, since that would put sold units on sale again.
    StockKeyRemoved,
}

/// Reservation states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    Pending,
    Confirmed,
    Released,
}

/// A reservation as the scripts record it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReservationRecord {
    pub state: RecordState,
    #[serde(default)]
    pub user: String,
    pub qty: u64,
    pub ver: u64,
    #[serde(default)]
    pub created_ms: Option<u64>,
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    #[serde(default)]
    pub confirmed_ms: Option<u64>,
    #[serde(default)]
    pub released_ms: Option<u64>,
    #[serde(default)]
    pub reason: Option<String>,
    /// 1 when released units went back to stock, 0 when their version was gone (retired).
    #[serde(default)]
    pub returned: Option<u8>,
    /// Set on the released marker written for an abandoned id that never reserved anything.
    #[serde(default)]
    pub tombstone: Option<u8>,
}

/// One stock version's ledger, read atomically with its stock key.
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
    pub ledger: bool,
    pub pending_reservations: i64,
    /// Units moved in from / out to other segments (rebalancing).
    pub moved_in: i64,
    pub moved_out: i64,
}

impl LedgerRow {
    pub(super) fn parse(version: u64, r: &[i64]) -> Option<Self> {
        match *r {
            [stock_key, remaining, initial, pending, confirmed, released, retired, ledger, pending_reservations, moved_in, moved_out] => {
                Some(LedgerRow {
                    version,
                    stock_key: stock_key == 1,
                    remaining,
                    initial,
                    pending,
                    confirmed,
                    released,
                    retired,
                    ledger: ledger == 1,
                    pending_reservations,
                    moved_in,
                    moved_out,
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
            stock_key: t.stock_key && r.stock_key,
            remaining: t.remaining + r.remaining,
            initial: t.initial + r.initial,
            pending: t.pending + r.pending,
            confirmed: t.confirmed + r.confirmed,
            released: t.released + r.released,
            retired: t.retired + r.retired,
            ledger: t.ledger || r.ledger,
            pending_reservations: t.pending_reservations + r.pending_reservations,
            moved_in: t.moved_in + r.moved_in,
            moved_out: t.moved_out + r.moved_out,
        }))
    }

    /// `initial + moved_in - moved_out - (remaining + pending + confirmed + retired)`: zero when
    /// every unit is accounted for. A version with no ledger and no stock key (never prewarmed, or expired
    /// with everything) has nothing to account for.
    pub fn drift(&self) -> i64 {
        if !self.ledger && !self.stock_key {
            return 0;
        }
        let remaining = if self.stock_key { self.remaining } else { 0 };
        self.initial + self.moved_in
            - self.moved_out
            - (remaining + self.pending + self.confirmed + self.retired)
    }
}

/// Parses the MULTI/EXEC reply of [`super::StockStore::snapshot`].
pub(super) fn parse_snapshot(
    versions: &[u64],
    values: &[Value],
) -> Option<(Vec<LedgerRow>, Vec<ReservationRecord>)> {
    const PER_VERSION: usize = 5;
    if values.len() != versions.len() * PER_VERSION + 1 {
        return None;
    }
    let mut rows = Vec::with_capacity(versions.len());
    for (i, &version) in versions.iter().enumerate() {
        let v = &values[i * PER_VERSION..(i + 1) * PER_VERSION];
        let ledger: Vec<i64> = match &v[2] {
            Value::Array(fields) => fields.iter().map(|f| int(Some(f)).unwrap_or(0)).collect(),
            _ => return None,
        };
        rows.push(LedgerRow {
            version,
            stock_key: int(v.first())? == 1,
            remaining: int(v.get(1)).unwrap_or(0),
            initial: *ledger.first()?,
            pending: *ledger.get(1)?,
            confirmed: *ledger.get(2)?,
            released: *ledger.get(3)?,
            retired: *ledger.get(4)?,
            ledger: int(v.get(3))? == 1,
            pending_reservations: int(v.get(4))?,
            moved_in: *ledger.get(5)?,
            moved_out: *ledger.get(6)?,
        });
    }
    let records = match values.last()? {
        Value::Array(raw) => raw
            .iter()
            .filter_map(|r| string(Some(r)))
            .map(|s| serde_json::from_str(&s).ok())
            .collect::<Option<Vec<ReservationRecord>>>()?,
        _ => return None,
    };
    Some((rows, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_drift() {
        let row = LedgerRow {
            version: 1,
            stock_key: true,
            remaining: 90,
            initial: 100,
            pending: 6,
            confirmed: 3,
            released: 5,
            retired: 1,
            ledger: true,
            pending_reservations: 6,
            moved_in: 0,
            moved_out: 0,
        };
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
    fn record_json_round_trip() {
        let raw =
            r#"{"state":"pending","user":"u","qty":2,"ver":3,"created_ms":1,"deadline_ms":2}"#;
        let rec: ReservationRecord = serde_json::from_str(raw).unwrap();
        assert_eq!((rec.state, rec.qty, rec.ver), (RecordState::Pending, 2, 3));
    }
}
