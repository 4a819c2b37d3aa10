//! The fleet's roll: every gateway says it is alive in Redis once a second, with what an
//! operator needs to tell it apart (its host, admin address, configuration generation), and
//! keeps the roll it read back for the admin API (`GET /v1/fleet`, the console's list).
//!
//! Approximation: the roll is of gateways that reached this Redis within the window, as this
//! gateway last read it (a second old, or `read_age_ms` when its beats fail). A gateway that
//! cannot reach Redis is missing from it, even if buyers still reach it; one that stopped stays
//! for up to the window. At most 64 gateways are listed (`lua/fleet.lua`).

use crate::stock::scripts::fleet::Roll;
use crate::stock::StockStore;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often each gateway says it is alive.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(1);
/// How long a gateway not heard from stays on the roll.
pub const WINDOW: Duration = Duration::from_secs(10);

/// The roll as this gateway last read it. One writer (the beat, [`Roster::beat`]); the admin
/// API reads it.
#[derive(Default)]
pub struct Roster {
    /// The last roll read, and when (this process's clock).
    last: Mutex<Option<(Roll, std::time::Instant)>>,
    /// Whether the last beat failed (said once per change, not every second).
    failing: std::sync::atomic::AtomicBool,
}

/// What a gateway says of itself on the roll.
pub struct About {
    pub admin: std::net::SocketAddr,
    pub listen: std::net::SocketAddr,
    pub generation: u64,
}

impl Roster {
    /// Says this gateway is alive and keeps the roll Redis answers. A failed beat keeps the
    /// roll read before (its `now_ms` says how old it is).
    pub async fn beat(&self, store: &StockStore, about: &About) {
        let text = json!({
            "host": host(),
            "pid": std::process::id(),
            "admin": about.admin.to_string(),
            "listen": about.listen.to_string(),
            "generation": about.generation,
            "build": env!("CARGO_PKG_VERSION"),
        })
        .to_string();
        use std::sync::atomic::Ordering::Relaxed;
        match store.fleet_beat(&text, WINDOW).await {
            Ok(roll) => {
                *self.last.lock().expect("roster lock") = Some((roll, std::time::Instant::now()));
                if self.failing.swap(false, Relaxed) {
                    tracing::info!("the fleet's roll is written again");
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Relaxed) {
                    tracing::warn!(error = %e,
                        "the fleet's roll is not written: the console lists this gateway's last \
                         reading, and other gateways stop listing this one");
                }
            }
        }
    }

    /// The roll as the admin API shows it: Redis's clock at the last beat read, how long ago
    /// that was (`read_age_ms`, this process's clock: more than a second or two when its beats
    /// fail), the window, and each gateway (this one marked `self`) with how long before that
    /// read it was last seen.
    pub fn view(&self, own_id: &str) -> Value {
        let last = self.last.lock().expect("roster lock").clone();
        let Some((roll, read_at)) = last else {
            return json!({"read_ms": null, "read_age_ms": null,
                "window_ms": WINDOW.as_millis() as u64, "gateways": []});
        };
        let gateways: Vec<Value> = roll
            .members
            .iter()
            .map(|m| {
                let mut g = serde_json::from_str::<Value>(&m.about)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                g["id"] = json!(m.id);
                g["self"] = json!(m.id == own_id);
                g["seen_ms_ago"] = json!(roll.now_ms.saturating_sub(m.seen_ms));
                g
            })
            .collect();
        json!({
            "read_ms": roll.now_ms,
            "read_age_ms": read_at.elapsed().as_millis() as u64,
            "window_ms": WINDOW.as_millis() as u64,
            "gateways": gateways,
        })
    }
}

/// This machine's host name (Linux), or "" where it cannot be read.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// Beats every [`BEAT_INTERVAL`] until shutdown.
pub async fn beat_forever(
    roster: Arc<Roster>,
    store: Arc<StockStore>,
    about: impl Fn() -> (std::net::SocketAddr, std::net::SocketAddr, u64) + Send,
    mut shutdown: pingora::server::ShutdownWatch,
) {
    let mut tick = tokio::time::interval(BEAT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {
                let (admin, listen, generation) = about();
                roster.beat(&store, &About { admin, listen, generation }).await;
            }
        }
    }
}
