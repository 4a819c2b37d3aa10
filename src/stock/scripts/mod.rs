//! The registry of every Lua script in `lua/`, each with `lib.lua` prepended (the waiting
//! room's also with `queue_lib.lua`), loaded once per process. Called by EVALSHA; redis-rs
//! loads a script and retries when Redis answers NOSCRIPT (after a restart or `SCRIPT FLUSH`).
//! Readiness loads every script listed in [`all`], so a gateway is not ready before each one is
//! in Redis.

pub mod acknowledge;
pub mod claim;
pub mod confirm;
pub mod deposit;
pub mod doubt;
pub mod due;
pub mod fleet;
pub mod halt;
pub mod ledger;
pub mod line;
pub mod master;
pub mod prewarm;
pub mod recount;
pub mod release;
pub mod reserve;
pub mod restock;
pub mod sweep;
pub mod tokens;
pub mod withdraw;

use redis::Script;
use std::sync::LazyLock;

const LIB: &str = include_str!("../../../lua/lib.lua");

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(super) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(&format!("{LIB}\n{}", include_str!($file))));
    };
}

script!(RESERVE, "../../../lua/reserve.lua");
script!(RESTOCK, "../../../lua/restock.lua");
script!(MASTER, "../../../lua/master.lua");
script!(RELEASE, "../../../lua/release.lua");
script!(CONFIRM, "../../../lua/confirm.lua");
script!(SWEEP, "../../../lua/sweep.lua");
script!(CLAIM, "../../../lua/claim.lua");
script!(PREWARM, "../../../lua/prewarm.lua");
script!(LEDGER, "../../../lua/ledger.lua");
script!(WITHDRAW, "../../../lua/withdraw.lua");
script!(DEPOSIT, "../../../lua/deposit.lua");
script!(ACKNOWLEDGE, "../../../lua/acknowledge.lua");
script!(DUE, "../../../lua/due.lua");
script!(TOKENS, "../../../lua/tokens.lua");
script!(RECOUNT, "../../../lua/recount.lua");
script!(DOUBT, "../../../lua/doubt.lua");
script!(LINE, "../../../lua/line.lua");
script!(FLEET, "../../../lua/fleet.lua");

/// The waiting room's shared Lua, prepended (after `lib.lua`) to its scripts.
const QUEUE_LIB: &str = include_str!("../../../lua/queue_lib.lua");

macro_rules! queue_script {
    ($name:ident, $file:literal) => {
        pub static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(&format!("{LIB}\n{QUEUE_LIB}\n{}", include_str!($file))));
    };
}

queue_script!(QUEUE_TICKET, "../../../lua/queue_ticket.lua");
queue_script!(QUEUE_STATE, "../../../lua/queue_state.lua");
queue_script!(QUEUE_CONTROL, "../../../lua/queue_control.lua");
queue_script!(QUEUE_POLL, "../../../lua/queue_poll.lua");
queue_script!(HALT, "../../../lua/halt.lua");
queue_script!(QUEUE_PLACE, "../../../lua/queue_place.lua");

/// Every script, for loading them up front (readiness).
pub(super) fn all() -> [&'static Script; 24] {
    [
        &RESERVE,
        &RESTOCK,
        &RELEASE,
        &CONFIRM,
        &SWEEP,
        &CLAIM,
        &PREWARM,
        &LEDGER,
        &WITHDRAW,
        &DEPOSIT,
        &ACKNOWLEDGE,
        &DUE,
        &QUEUE_TICKET,
        &QUEUE_STATE,
        &QUEUE_CONTROL,
        &QUEUE_POLL,
        &HALT,
        &TOKENS,
        &QUEUE_PLACE,
        &MASTER,
        &RECOUNT,
        &DOUBT,
        &LINE,
        &FLEET,
    ]
}
