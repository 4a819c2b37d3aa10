//! The store's calls as traits, each the calls one kind of caller makes, so that the layers
//! above can be run against an in-process fake (their unit tests) as well as against Redis.
//! [`StockStore`] implements each where the call is made (its script's module, or
//! `stock/reads.rs`), and the contract of each call (what the script does) is written down
//! there and in `lua/`; the fake (`stock::fake`) implements the same traits.
//!
//! - [`Reads`]: metas, records and transfer books (nothing here changes stock), and
//!   [`LedgerScript`];
//! - [`Settle`]: what ends or moves a reservation after its reserve (release, confirm, the
//!   sweep, a restock, an early due time): one trait per script, declared in its module;
//! - [`Transfers`]: moving units between segments (withdraw, deposit, acknowledge);
//! - [`Publish`]: the pub/sub channel the instances share.
//!
//! Futures are `Send` (the lifecycle settles off the buyer's path, in spawned tasks) and
//! unboxed: the real store pays nothing for the seam.

pub use super::scripts::acknowledge::AcknowledgeScript;
pub use super::scripts::confirm::ConfirmScript;
pub use super::scripts::deposit::DepositScript;
pub use super::scripts::due::DueScript;
pub use super::scripts::ledger::LedgerScript;
pub use super::scripts::release::ReleaseScript;
pub use super::scripts::reserve::ReserveScript;
pub use super::scripts::restock::RestockScript;
pub use super::scripts::sweep::SweepScript;
pub use super::scripts::withdraw::WithdrawScript;
use super::{ReservationRecord, Segment, SegmentMeta, StoreError, Transfer};
use std::future::Future;

/// Reads of one segment and of the activity registry.
pub trait Reads: LedgerScript + Send + Sync {
    /// See `StockStore`'s `meta`.
    fn meta(
        &self,
        segment: Segment<'_>,
    ) -> impl Future<Output = Result<SegmentMeta, StoreError>> + Send;

    /// See `StockStore`'s `base_meta`.
    fn base_meta(&self, id: &str) -> impl Future<Output = Result<SegmentMeta, StoreError>> + Send;

    /// See `StockStore`'s `registered`.
    fn registered(&self) -> impl Future<Output = Result<Vec<(String, u32)>, StoreError>> + Send;

    /// See `StockStore`'s `registered_segments`.
    fn registered_segments(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<u32>, StoreError>> + Send;

    /// See `StockStore`'s `lookup`.
    fn lookup(
        &self,
        segment: Segment<'_>,
        reservation_id: &str,
    ) -> impl Future<Output = Result<Option<ReservationRecord>, StoreError>> + Send;

    /// See `StockStore`'s `transfers`.
    fn transfers(
        &self,
        giver: Segment<'_>,
    ) -> impl Future<Output = Result<(Vec<Transfer>, u64), StoreError>> + Send;
}

/// What settles reservations after their reserve: every script that ends or moves one.
pub trait Settle: ReleaseScript + ConfirmScript + SweepScript + RestockScript + DueScript {}

impl<S: ReleaseScript + ConfirmScript + SweepScript + RestockScript + DueScript> Settle for S {}

/// Moving units between segments: a transfer's two halves, and the giver learning it landed.
pub trait Transfers: WithdrawScript + DepositScript + AcknowledgeScript {}

impl<S: WithdrawScript + DepositScript + AcknowledgeScript> Transfers for S {}

/// The pub/sub channel every instance listens on.
pub trait Publish: Send + Sync {
    /// The channel's name (see [`super::KeyLayout::news_channel`]).
    fn news_channel(&self) -> String;

    /// See `StockStore`'s `publish`.
    fn publish(
        &self,
        channel: &str,
        message: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
