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

/// `slow_halt_reads`: every read of an activity's halt takes 1.5 s more (as a Redis slow to
/// reach at start-up).
pub(in crate::stock) async fn before_halt_read() {
    if std::env::var("FLASHGATE_FAULT").as_deref() == Ok("slow_halt_reads") {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    }
}
