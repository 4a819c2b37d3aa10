//! Test-only faults in the stock layer (feature `fault-injection`, env `FLASHGATE_FAULT`).

use super::{Segment, StockStore};

/// `damage_home_before_deposit`: as an operator deleting a key by hand in the instant
/// between a pull's withdraw and its deposit, the home segment loses its users
/// placeholder (it is then damaged, and its reserve answers before the deposit).
pub(in crate::stock) async fn before_deposit(store: &StockStore, home: Segment<'_>) {
    if std::env::var("FLASHGATE_FAULT").as_deref() != Ok("damage_home_before_deposit") {
        return;
    }
    let users = store.keys().of(home).users();
    let _ = store
        .query::<i64>(super::StoreOp::Read, redis::cmd("HDEL").arg(users).arg(""))
        .await;
}
