//! End-to-end tests: the real flashgate binary between a private redis-server and the demo
//! upstream, driven over real sockets.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod attacks;
mod burst;
mod decisions;
mod edge;
mod failures;
mod fences;
mod hours_review;
mod hours_review2;
mod integrity;
mod integrity_review;
mod lifecycle;
mod news;
mod operations;
mod queue;
mod queue_review;
mod queue_review2;
mod queue_review3;
mod queue_support;
mod reservations;
mod security;
mod segments;
mod waiting_page;
