//! The Lua scripts in `lua/`, each with `lib.lua` prepended, loaded once per process.
//! Called by EVALSHA; redis-rs loads a script and retries when Redis answers NOSCRIPT (after a
//! restart or `SCRIPT FLUSH`).

use redis::Script;
use std::sync::LazyLock;

const LIB: &str = include_str!("../../lua/lib.lua");

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(super) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(&format!("{LIB}\n{}", include_str!($file))));
    };
}

script!(RESERVE, "../../lua/reserve.lua");
script!(RELEASE, "../../lua/release.lua");
script!(CONFIRM, "../../lua/confirm.lua");
script!(SWEEP, "../../lua/sweep.lua");
script!(CLAIM, "../../lua/claim.lua");
script!(PREWARM, "../../lua/prewarm.lua");
script!(LEDGER, "../../lua/ledger.lua");
script!(WITHDRAW, "../../lua/withdraw.lua");
script!(DEPOSIT, "../../lua/deposit.lua");
script!(ACKNOWLEDGE, "../../lua/acknowledge.lua");
script!(DUE, "../../lua/due.lua");

/// Every script, for loading them up front (readiness).
pub(super) fn all() -> [&'static Script; 11] {
    [
        &RESERVE,
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
    ]
}
