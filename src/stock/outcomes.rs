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
        /// The record's fence once this request's forward is counted (see `lua/lib.lua`).
        fence: u64,
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
        /// The record's fence once this request's forward is counted.
        fence: u64,
    },
    /// The key's reservation is pending past its hold deadline: being settled (expiry or the
    /// order lookup), never handed out again.
    HoldRanOut,
    /// Replay only, and the key had won nothing.
    NotReplayed,
    /// The key's reservation is for another quantity: this request is not its retry.
    ReplayQuantityDiffers {
        qty: u32,
    },
    /// The key's reservation is pending under another version: asked again (replay only)
    /// with that version's keys, so the replay moves its due time where the sweep reads it.
    OtherVersion {
        version: u64,
    },
    /// The key's reservation kept changing under repeated asks (settled, then won again
    /// under another version): nothing taken, the buyer may try again.
    Contended,
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
    /// Whether a reserve that carried a deposit surely made it (the script deposits before
    /// every answer but these: a partition never prewarmed or damaged answers before it, a
    /// refused deposit changed nothing, and "no stock key" comes both before and after it).
    pub fn deposit_landed(&self) -> bool {
        !matches!(
            self,
            ReserveOutcome::NoStockKey
                | ReserveOutcome::Damaged
                | ReserveOutcome::DepositRefused { .. }
        )
    }

    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let at = |i: usize| int(reply.get(i));
        let unsigned = |i: usize| at(i).map(|v| v.max(0) as u64);
        let ms = |i: usize| string(reply.get(i))?.parse::<u64>().ok();
        Some(match at(0)? {
            1 => ReserveOutcome::Reserved {
                remaining: unsigned(1)?,
                created_ms: ms(3)?,
                deadline_ms: ms(4)?,
                fence: ms(5)?,
            },
            2 => ReserveOutcome::Replayed {
                remaining: at(1).and_then(|r| u64::try_from(r).ok()),
                qty: u32::try_from(at(2)?).ok()?,
                id: string(reply.get(3))?,
                version: string(reply.get(4))?.parse().ok()?,
                created_ms: ms(5)?,
                deadline_ms: ms(6)?,
                fence: ms(7)?,
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
            -11 => ReserveOutcome::ReplayQuantityDiffers {
                qty: u32::try_from(at(1)?).ok()?,
            },
            -12 => ReserveOutcome::OtherVersion {
                version: unsigned(1)?,
            },
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
    /// The backend said it holds no such order: pending only, and only if the reservation's
    /// fence is still the one the sweep's hand-out set (nothing forwarded or handed out since
    /// the question was asked).
    Lookup { fence: u64 },
    /// The backend or an operator cancels: pending or confirmed.
    Admin,
}

impl ReleaseMode {
    /// The fence a release names (`ARGV[6]` of `lua/release.lua`; lookup only).
    pub fn fence(self) -> Option<u64> {
        match self {
            ReleaseMode::Lookup { fence } => Some(fence),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseMode::Owner => "owner",
            ReleaseMode::Abandon => "abandon",
            ReleaseMode::Lookup { .. } => "lookup",
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
    /// Kept: a lookup's answer older than a forward (a replay) or a hand-out since.
    Fenced,
    /// Kept: a lookup's "not found" before the hold deadline (its token is still valid, so a
    /// slow backend may still take the order); asked again at the deadline.
    TooEarly,
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
            (-5, _) => ReleaseOutcome::Fenced,
            (-6, _) => ReleaseOutcome::TooEarly,
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
    /// Released, yet the backend took the order (its 2xx, or its order lookup): counted as
    /// accepted late, and covered by a unit of the version's stock.
    LateCovered,
    /// The same with no stock left to cover it: the version is oversold by its units.
    LateOversold,
    Unknown,
    VersionMismatch,
}

impl ConfirmOutcome {
    /// Whether the reservation had been released (too late to confirm), accepted late or not.
    pub fn released(self) -> bool {
        matches!(
            self,
            ConfirmOutcome::Released | ConfirmOutcome::LateCovered | ConfirmOutcome::LateOversold
        )
    }

    /// The backend accepted it after its release: what became of its units.
    pub fn late(self) -> Option<super::LateOutcome> {
        match self {
            ConfirmOutcome::LateCovered => Some(super::LateOutcome::Covered),
            ConfirmOutcome::LateOversold => Some(super::LateOutcome::Oversold),
            _ => None,
        }
    }

    pub(super) fn parse(reply: i64) -> Option<Self> {
        Some(match reply {
            1 => ConfirmOutcome::Confirmed,
            0 => ConfirmOutcome::AlreadyConfirmed,
            -1 => ConfirmOutcome::Unknown,
            -2 => ConfirmOutcome::VersionMismatch,
            -3 => ConfirmOutcome::Released,
            -4 => ConfirmOutcome::LateCovered,
            -5 => ConfirmOutcome::LateOversold,
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
    pub for_lookup: Vec<Leased>,
}

/// A reservation a sweep handed out for an order lookup, with the fence the hand-out set: a
/// "not found" releases it only under that fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub id: String,
    pub fence: u64,
}

impl SweepOutcome {
    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let n = |i: usize| int(reply.get(i)).and_then(|v| u64::try_from(v).ok());
        Some(SweepOutcome {
            released: n(0)?,
            units: n(1)?,
            scanned: n(2)?,
            retired: n(3)?,
            for_lookup: reply[4.min(reply.len())..]
                .chunks(2)
                .map(|pair| {
                    Some(Leased {
                        id: string(pair.first())?,
                        fence: string(pair.get(1))?.parse().ok()?,
                    })
                })
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
    /// This version was claimed before and its keys are gone (expired after the sale, or
    /// removed): it never sells again.
    SoldBefore {
        version: u64,
    },
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
            -4 => ClaimOutcome::SoldBefore {
                version: value?.parse().ok()?,
            },
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
