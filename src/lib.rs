//! flashgate: a flash-sale gateway. A Pingora reverse proxy that admits sale requests against
//! stock held in Redis (one atomic Lua script per decision) and forwards only the winners, each
//! with a signed reservation, to the shop backend.
#![forbid(unsafe_code)]

pub mod access;
pub mod admin;
pub mod catalogue;
pub mod client_policy;
pub mod coalesce;
pub mod config;
pub mod decision;
pub mod decision_log;
pub mod edge;
pub mod fleet;
pub mod front;
pub mod gateway;
pub mod header_names;
pub mod held;
pub mod lifecycle;
pub mod live;
pub mod live_check;
pub mod logging;
pub mod maintenance;
pub mod metrics;
pub mod news;
pub mod pages;
pub mod proxy;
pub mod purchase;
pub mod reconcile;
pub mod reload;
pub mod report;
pub mod reservation;
pub mod sale;
pub mod series;
pub mod server;
pub mod shutdown;
pub mod stock;
pub mod upstream;
pub mod waiting;

pub use config::{ConfigError, Settings};
