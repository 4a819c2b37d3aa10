//! What the last `flashgate reconcile --orders` of an activity found, kept in Redis for the
//! operator who counts next (the admin view's `orders_check`, the console's fence panel): when
//! (Redis's clock), and how many of the backend's orders Redis holds confirmed, pending, pending
//! in doubt, released after the sale, or not at all. One hash on the activity's base tag,
//! expiring with its keys; each run replaces the last.

use super::{Layout, StockStore, StoreError, StoreOp};
use crate::config::Activity;
use std::collections::HashMap;

/// The counts of one run: the ids read, those of other activities (left out), and what Redis
/// holds of the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct OrdersCheck {
    /// When it ran (unix ms, Redis's clock).
    pub at_ms: u64,
    /// Order ids the file held (an empty file reads 0: no check at all, not a clean one).
    pub read: u64,
    /// Of them, ids of another configured activity (not counted below).
    pub elsewhere: u64,
    pub confirmed: u64,
    pub pending: u64,
    pub in_doubt: u64,
    pub released: u64,
    /// Orders Redis holds no record of (it forgot the sale).
    pub unknown: u64,
}

const FIELDS: [&str; 7] = [
    "read",
    "elsewhere",
    "confirmed",
    "pending",
    "in_doubt",
    "released",
    "unknown",
];

impl OrdersCheck {
    fn counts(&self) -> [u64; 7] {
        [
            self.read,
            self.elsewhere,
            self.confirmed,
            self.pending,
            self.in_doubt,
            self.released,
            self.unknown,
        ]
    }
}

impl StockStore {
    fn orders_check_key(&self, activity: &Activity) -> String {
        self.keys()
            .base(&Layout::new(activity.id.clone(), 1))
            .orders_check()
    }

    /// Records a run's counts (`at_ms` is taken from Redis's clock here), replacing the last.
    pub async fn record_orders_check(
        &self,
        activity: &Activity,
        check: OrdersCheck,
    ) -> Result<(), StoreError> {
        let (secs, micros): (u64, u64) = self.query(StoreOp::Read, &redis::cmd("TIME")).await?;
        let at_ms = secs * 1000 + micros / 1000;
        let key = self.orders_check_key(activity);
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("DEL").arg(&key).ignore();
        let mut hset = redis::cmd("HSET");
        hset.arg(&key).arg("at_ms").arg(at_ms);
        for (field, n) in FIELDS.iter().zip(check.counts()) {
            hset.arg(*field).arg(n);
        }
        pipe.add_command(hset).ignore();
        pipe.cmd("EXPIREAT")
            .arg(&key)
            .arg(self.expire_at(activity))
            .ignore();
        let () = self
            .redis
            .pipeline(StoreOp::Read, self.timeout(), &pipe, None)
            .await?;
        Ok(())
    }

    /// The last run's counts, if one is recorded.
    pub async fn orders_check(
        &self,
        activity: &Activity,
    ) -> Result<Option<OrdersCheck>, StoreError> {
        let all: HashMap<String, u64> = self
            .query(
                StoreOp::Read,
                redis::cmd("HGETALL").arg(self.orders_check_key(activity)),
            )
            .await?;
        let Some(&at_ms) = all.get("at_ms") else {
            return Ok(None);
        };
        let n = |f: &str| all.get(f).copied().unwrap_or(0);
        Ok(Some(OrdersCheck {
            at_ms,
            read: n("read"),
            elsewhere: n("elsewhere"),
            confirmed: n("confirmed"),
            pending: n("pending"),
            in_doubt: n("in_doubt"),
            released: n("released"),
            unknown: n("unknown"),
        }))
    }
}
