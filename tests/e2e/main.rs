//! End-to-end tests: the real flashgate binary between a private redis-server and the demo
//! upstream, driven over real sockets.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod attacks;
mod before_open;
mod browser;
mod burst;
mod check_live;
mod console;
mod cors;
mod decisions;
mod defence;
mod door;
mod doubt;
mod drop_pages;
mod edge;
mod failover;
mod failures;
mod fences;
mod fleet_limits;
mod forgetting;
mod front;
mod halt;
mod identity_headers;
mod integrity;
mod lifecycle;
mod live_queue;
mod news;
mod operations;
mod page_headers;
mod pages;
mod phases;
mod precedence;
mod queue;
mod queue_support;
mod queue_windows;
mod report;
mod reservations;
mod restock;
mod sale_hours;
mod second_chance;
mod security;
mod segments;
mod settling;
mod variants;
mod waiting_page;
