//! The gates of the purchase pipeline, in the order they run: each cheaper than the next, the
//! first that answers decides. A new gate is a file here and a line in [`GATES`].

pub mod activity_bucket;
pub mod body;
pub mod halt;
pub mod hours;
pub mod identity;
pub mod ip_bucket;
pub mod quantity;
pub mod reserve;
pub mod sold_out;
pub mod user_bucket;
pub mod waiting_room;

use super::Gate;

/// Every gate, in order. Gates after `Identity` read who buys what; the reserve answers last.
pub static GATES: &[&dyn Gate] = &[
    &ip_bucket::IpBucket,
    &identity::Identity,
    &quantity::Quantity,
    &hours::Hours,
    &halt::Halt,
    &user_bucket::UserBucket,
    &sold_out::SoldOut,
    &waiting_room::WaitingRoom,
    &activity_bucket::ActivityBucket,
    &body::Body,
    &reserve::Reserve,
];
