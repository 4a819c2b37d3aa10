//! The store's calls as traits, each the calls one kind of caller makes, so that the layers
//! above can be run against an in-process fake (their unit tests) as well as against Redis.
//! [`StockStore`] implements each by delegating to its own method of the same name; the
//! contract of each call (what the script does) is written down there and in `lua/`.
//!
//! - [`Reads`]: metas, ledgers, records and transfer books (nothing here changes stock);
//! - [`Settle`]: what ends or moves a reservation after its reserve (release, confirm, the
//!   sweep, an early due time);
//! - [`Transfers`]: moving units between segments (withdraw, deposit, acknowledge);
//! - [`Publish`]: the pub/sub channel the instances share.
//!
//! Futures are `Send` (the lifecycle settles off the buyer's path, in spawned tasks) and
//! unboxed: the real store pays nothing for the seam.

use super::{
    ConfirmOutcome, ConfirmedVia, Deposit, LedgerRow, LookupLease, ReleaseMode, ReleaseOutcome,
    ReleaseReason, ReservationRecord, RestockOutcome, Segment, SegmentMeta, StockStore, StoreError,
    SweepOutcome, Transfer,
};
use std::future::Future;
use std::time::Duration;

/// Reads of one segment and of the activity registry.
pub trait Reads: Send + Sync {
    /// See [`StockStore::meta`].
    fn meta(
        &self,
        segment: Segment<'_>,
    ) -> impl Future<Output = Result<SegmentMeta, StoreError>> + Send;

    /// See [`StockStore::base_meta`].
    fn base_meta(&self, id: &str) -> impl Future<Output = Result<SegmentMeta, StoreError>> + Send;

    /// See [`StockStore::registered`].
    fn registered(&self) -> impl Future<Output = Result<Vec<(String, u32)>, StoreError>> + Send;

    /// See [`StockStore::registered_segments`].
    fn registered_segments(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<u32>, StoreError>> + Send;

    /// See [`StockStore::ledger`].
    fn ledger(
        &self,
        segment: Segment<'_>,
        version: u64,
    ) -> impl Future<Output = Result<LedgerRow, StoreError>> + Send;

    /// See [`StockStore::lookup`].
    fn lookup(
        &self,
        segment: Segment<'_>,
        reservation_id: &str,
    ) -> impl Future<Output = Result<Option<ReservationRecord>, StoreError>> + Send;

    /// See [`StockStore::transfers`].
    fn transfers(
        &self,
        giver: Segment<'_>,
    ) -> impl Future<Output = Result<(Vec<Transfer>, u64), StoreError>> + Send;
}

/// What settles reservations after their reserve.
pub trait Settle: Send + Sync {
    /// See [`StockStore::release`].
    fn release(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> impl Future<Output = Result<ReleaseOutcome, StoreError>> + Send;

    /// See [`StockStore::confirm`].
    fn confirm(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> impl Future<Output = Result<Vec<ConfirmOutcome>, StoreError>> + Send;

    /// See [`StockStore::sweep`].
    fn sweep(
        &self,
        segment: Segment<'_>,
        version: u64,
        batch: u32,
        lookup: Option<LookupLease>,
    ) -> impl Future<Output = Result<SweepOutcome, StoreError>> + Send;

    /// See [`StockStore::restock`].
    fn restock(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        idempotency_key: Option<&str>,
        expire_at: u64,
    ) -> impl Future<Output = Result<RestockOutcome, StoreError>> + Send;

    /// See [`StockStore::due_in`].
    fn due_in(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        fence: u64,
        after: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Moving units between segments: a transfer's two halves, and the giver learning it landed.
pub trait Transfers: Send + Sync {
    /// See [`StockStore::withdraw`].
    fn withdraw(
        &self,
        giver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        want: u64,
        to: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// See [`StockStore::deposit`].
    fn deposit(
        &self,
        receiver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        qty: u64,
    ) -> impl Future<Output = Result<Deposit, StoreError>> + Send;

    /// See [`StockStore::acknowledge`].
    fn acknowledge(
        &self,
        giver: Segment<'_>,
        transfer_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The pub/sub channel every instance listens on.
pub trait Publish: Send + Sync {
    /// The channel's name (see [`super::KeyLayout::news_channel`]).
    fn news_channel(&self) -> String;

    /// See [`StockStore::publish`].
    fn publish(
        &self,
        channel: &str,
        message: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl Reads for StockStore {
    async fn meta(&self, segment: Segment<'_>) -> Result<SegmentMeta, StoreError> {
        StockStore::meta(self, segment).await
    }

    async fn base_meta(&self, id: &str) -> Result<SegmentMeta, StoreError> {
        StockStore::base_meta(self, id).await
    }

    async fn registered(&self) -> Result<Vec<(String, u32)>, StoreError> {
        StockStore::registered(self).await
    }

    async fn registered_segments(&self, id: &str) -> Result<Option<u32>, StoreError> {
        StockStore::registered_segments(self, id).await
    }

    async fn ledger(&self, segment: Segment<'_>, version: u64) -> Result<LedgerRow, StoreError> {
        StockStore::ledger(self, segment, version).await
    }

    async fn lookup(
        &self,
        segment: Segment<'_>,
        reservation_id: &str,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        StockStore::lookup(self, segment, reservation_id).await
    }

    async fn transfers(&self, giver: Segment<'_>) -> Result<(Vec<Transfer>, u64), StoreError> {
        StockStore::transfers(self, giver).await
    }
}

impl Settle for StockStore {
    async fn release(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        mode: ReleaseMode,
        reason: ReleaseReason,
    ) -> Result<ReleaseOutcome, StoreError> {
        StockStore::release(self, segment, version, reservation_id, mode, reason).await
    }

    async fn confirm(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_ids: &[&str],
        via: ConfirmedVia,
    ) -> Result<Vec<ConfirmOutcome>, StoreError> {
        StockStore::confirm(self, segment, version, reservation_ids, via).await
    }

    async fn sweep(
        &self,
        segment: Segment<'_>,
        version: u64,
        batch: u32,
        lookup: Option<LookupLease>,
    ) -> Result<SweepOutcome, StoreError> {
        StockStore::sweep(self, segment, version, batch, lookup).await
    }

    async fn restock(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        idempotency_key: Option<&str>,
        expire_at: u64,
    ) -> Result<RestockOutcome, StoreError> {
        StockStore::restock(self, segment, version, units, idempotency_key, expire_at).await
    }

    async fn due_in(
        &self,
        segment: Segment<'_>,
        version: u64,
        reservation_id: &str,
        fence: u64,
        after: Duration,
    ) -> Result<(), StoreError> {
        StockStore::due_in(self, segment, version, reservation_id, fence, after).await
    }
}

impl Transfers for StockStore {
    async fn withdraw(
        &self,
        giver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        want: u64,
        to: u32,
    ) -> Result<u64, StoreError> {
        StockStore::withdraw(self, giver, version, transfer_id, want, to).await
    }

    async fn deposit(
        &self,
        receiver: Segment<'_>,
        version: u64,
        transfer_id: &str,
        qty: u64,
    ) -> Result<Deposit, StoreError> {
        StockStore::deposit(self, receiver, version, transfer_id, qty).await
    }

    async fn acknowledge(&self, giver: Segment<'_>, transfer_id: &str) -> Result<(), StoreError> {
        StockStore::acknowledge(self, giver, transfer_id).await
    }
}

impl Publish for StockStore {
    fn news_channel(&self) -> String {
        self.keys().news_channel()
    }

    async fn publish(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        StockStore::publish(self, channel, message).await
    }
}
