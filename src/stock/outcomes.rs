//! What the scripts answer, as Rust types: one outcome enum per script.

use super::records::{int, string};
use redis::Value;

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    Reserved {
        remaining: u64,
        /// When it was made and when its hold runs out (Redis's clock, unix ms).
        created_ms: u64,
        deadline_ms: u64,
    },
    /// The buyer's `Idempotency-Key` already won this (not released) reservation.
    Replayed {
        id: String,
        qty: u32,
        version: u64,
        /// Units left in the partition's current version, if its key exists.
        remaining: Option<u64>,
        created_ms: u64,
        deadline_ms: u64,
    },
    /// The key's reservation is pending past its hold deadline: being settled (expiry or the
    /// order lookup), never handed out again.
    HoldRanOut,
    /// Replay only, and the key had won nothing.
    NotReplayed,
    /// Before the sale's hours, by Redis's clock: nothing changed.
    NotStarted,
    /// After the sale's hours, by Redis's clock: nothing changed.
    Ended,
    /// The stock key of this version does not exist (not prewarmed yet, or retired).
    NoStockKey,
    Insufficient {
        remaining: u64,
    },
    LimitExceeded {
        held: u64,
    },
    /// The reservation id exists already (a tombstone of an abandoned attempt).
    DuplicateId,
    /// The partition lost a key it had (its users or records): refused.
    Damaged,
    /// The transfer to deposit first could not land (its version has no ledger here, or the
    /// partition lost its book of received transfers): nothing changed, it stays in flight.
    DepositRefused {
        /// The received book is lost (the partition is damaged).
        damaged: bool,
    },
}

impl ReserveOutcome {
    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let at = |i: usize| int(reply.get(i));
        let unsigned = |i: usize| at(i).map(|v| v.max(0) as u64);
        let ms = |i: usize| string(reply.get(i))?.parse::<u64>().ok();
        Some(match at(0)? {
            1 => ReserveOutcome::Reserved {
                remaining: unsigned(1)?,
                created_ms: ms(3)?,
                deadline_ms: ms(4)?,
            },
            2 => ReserveOutcome::Replayed {
                remaining: at(1).and_then(|r| u64::try_from(r).ok()),
                qty: u32::try_from(at(2)?).ok()?,
                id: string(reply.get(3))?,
                version: string(reply.get(4))?.parse().ok()?,
                created_ms: ms(5)?,
                deadline_ms: ms(6)?,
            },
            -1 => ReserveOutcome::NoStockKey,
            -2 => ReserveOutcome::Insufficient {
                remaining: unsigned(1)?,
            },
            -3 => ReserveOutcome::LimitExceeded { held: unsigned(2)? },
            -4 => ReserveOutcome::DuplicateId,
            -5 => ReserveOutcome::HoldRanOut,
            -6 => ReserveOutcome::Damaged,
            -8 => ReserveOutcome::NotReplayed,
            -9 => ReserveOutcome::NotStarted,
            -10 => ReserveOutcome::Ended,
            -7 => ReserveOutcome::DepositRefused {
                damaged: at(1)? == -2,
            },
            _ => return None,
        })
    }
}

/// Who asks for a release, which decides what may be released (see `lua/release.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseMode {
    /// The request that made the reservation failed: pending only, and not once a replay handed
    /// the reservation to another request.
    Owner,
    /// The request that sent the reserve does not know whether it landed: as `Owner`, and an
    /// unknown id is tombstoned so the reserve can never land later.
    Abandon,
    /// The backend said it holds no such order: pending only.
    Lookup,
    /// The backend or an operator cancels: pending or confirmed.
    Admin,
}

impl ReleaseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseMode::Owner => "owner",
            ReleaseMode::Abandon => "abandon",
            ReleaseMode::Lookup => "lookup",
            ReleaseMode::Admin => "admin",
        }
    }
}

/// What the release script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Units returned; `remaining` is `None` when the version is no longer on sale in that
    /// partition (the units are then counted as retired: stock is never created from nothing).
    Released {
        remaining: Option<u64>,
    },
    AlreadyReleased,
    Unknown,
    VersionMismatch,
    /// Kept: it is confirmed, and only an admin release gives back a confirmed sale.
    KeptConfirmed,
    /// Kept: an idempotent replay handed it to another request.
    KeptReplayed,
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
            (-3, _) => ReleaseOutcome::KeptConfirmed,
            (-4, _) => ReleaseOutcome::KeptReplayed,
            _ => return None,
        })
    }
}

/// What the confirm script did with one reservation.
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

/// What one sweep call did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SweepOutcome {
    pub released: u64,
    pub units: u64,
    /// Due entries looked at; a full batch means more may be due.
    pub scanned: u64,
    /// Released reservations whose version was no longer on sale (units retired).
    pub retired: u64,
    /// Due reservations handed out to ask the backend about (order lookup).
    pub for_lookup: Vec<String>,
}

impl SweepOutcome {
    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let n = |i: usize| int(reply.get(i)).and_then(|v| u64::try_from(v).ok());
        Some(SweepOutcome {
            released: n(0)?,
            units: n(1)?,
            scanned: n(2)?,
            retired: n(3)?,
            for_lookup: reply
                .iter()
                .skip(4)
                .map(|v| string(Some(v)))
                .collect::<Option<_>>()?,
        })
    }
}

/// Whether an activity's configuration agrees with what Redis recorded about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    Claimed,
    /// It was first sold with another segment count, fixed for the life of its keys.
    SegmentsFixed {
        first: u32,
    },
    /// A newer version was already prewarmed: this configuration is older.
    Older {
        newest: u64,
    },
    /// Its keys were written by an older flashgate's layout.
    OldLayout,
}

impl ClaimOutcome {
    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let value = string(reply.get(1));
        Some(match int(reply.first())? {
            1 => ClaimOutcome::Claimed,
            -1 => ClaimOutcome::SegmentsFixed {
                first: value?.parse().ok()?,
            },
            -2 => ClaimOutcome::Older {
                newest: value?.parse().ok()?,
            },
            -3 => ClaimOutcome::OldLayout,
            _ => return None,
        })
    }
}

/// What prewarm found in one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrewarmOutcome {
    /// The version went on sale here now (the one before it, if any, retired).
    Created,
    Exists,
    /// A key the partition had is gone (a placeholder, the event stream, the ledger on sale, or
    /// the meta while anything else remains): the per-user limit, the records or the versions
    /// to sweep can no longer be trusted.
    Damaged,
    /// The version is on sale here but its stock key is gone (removed by hand, or lost): it is
    /// not re-created, since that would put sold units on sale again.
    StockKeyRemoved,
    /// A newer version is on sale here.
    Older {
        current: u64,
    },
}

/// What a deposit (the second half of a transfer) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deposit {
    /// The units arrived now.
    Landed,
    /// They had arrived before (once per transfer id).
    AlreadyLanded,
    /// They cannot land: no ledger of their version here, or the partition lost its book of
    /// received transfers. Nothing changed; the transfer stays in flight (never acknowledged).
    Refused,
}

impl Deposit {
    pub(super) fn parse(code: i64) -> Option<Deposit> {
        match code {
            1 => Some(Deposit::Landed),
            0 => Some(Deposit::AlreadyLanded),
            -1 | -2 => Some(Deposit::Refused),
            _ => None,
        }
    }

    /// Whether the giver may forget the transfer (acknowledge it).
    pub fn arrived(self) -> bool {
        self != Deposit::Refused
    }
}
