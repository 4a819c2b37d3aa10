//! The gates of the purchase pipeline, in the order they run: each cheaper than the next, the
//! first that answers decides. A new gate is a file here and a line in the list below.

pub mod activity_bucket;
pub mod body;
pub mod halt;
pub mod hours;
pub mod identity;
pub mod ip_bucket;
pub mod phase;
pub mod quantity;
pub mod reserve;
pub mod sold_out;
pub mod user_bucket;
pub mod variant;
pub mod waiting_room;

use super::{Attempt, Gate, Parts, Step, Verdict};

/// Defines [`run`] and [`names`] from one list, so the order tested is the order run.
macro_rules! in_order {
    ($($gate:expr),+ $(,)?) => {
        /// Runs a purchase through every gate in order: the first answer is the verdict
        /// (`None` if none answered). Each gate is called by its type, so the whole pipeline is
        /// one future: no allocation per gate.
        pub async fn run(parts: Parts<'_>, attempt: &mut Attempt<'_>) -> Option<Verdict> {
            $(
                if let Step::Answer(verdict) = Gate::check(&$gate, parts, attempt).await {
                    return Some(verdict);
                }
            )+
            None
        }

        /// Every gate's name, in the order [`run`] runs them.
        pub fn names() -> Vec<&'static str> {
            vec![$(Gate::name(&$gate)),+]
        }
    };
}

// Every gate, in order. Gates after `Identity` read who buys what; the reserve answers last.
in_order![
    ip_bucket::IpBucket,
    identity::Identity,
    variant::Variant,
    quantity::Quantity,
    phase::Phase,
    hours::Hours,
    halt::Halt,
    user_bucket::UserBucket,
    sold_out::SoldOut,
    waiting_room::WaitingTurn,
    activity_bucket::ActivityBucket,
    body::Body,
    reserve::Reserve,
];
