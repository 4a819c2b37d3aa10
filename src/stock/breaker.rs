//! A circuit breaker in front of the stock store, on the buyer's path only.
//!
//! After `consecutive_failures` store calls in a row fail (error or timeout), the breaker opens
//! for `open_ms`: buyers get their activity's store-failure answer at once (`unavailable`, or a
//! passthrough) instead of each waiting out `redis.timeout_ms`. When the period ends one probe
//! call goes to Redis (half-open): success closes the breaker, failure opens it again.
//! Background work (releases, sweeps, confirms) keeps its own retries and is not gated.
//!
//! The admin API can hold it open (treat Redis as down: drain traffic off a sick Redis) or
//! closed (ignore failures) until switched back to auto. The switch is per instance and held in
//! memory: it survives reloads, not restarts.
//!
//! The thresholds are the caller's configuration generation's (`redis.breaker`), passed on each
//! call: a reload applies to the requests that start after it, as everything else does.
//!
//! Time is `tokio::time::Instant`, so tests drive it with a paused clock.

use crate::config::BreakerSettings;
use crate::label_enum;
use crate::metrics::Metrics;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::time::Instant;

label_enum! {
    /// The breaker's state, as the `state` label.
    pub enum BreakerState {
        /// Calls go to Redis.
        Closed => "closed",
        /// Calls are skipped: the store counts as failed.
        Open => "open",
        /// The open period ended: one probe call goes to Redis.
        HalfOpen => "half_open",
    }
}

label_enum! {
    /// The breaker's manual switch (admin API), as the `mode` label.
    pub enum BreakerMode {
        /// Opens and closes on the store's answers.
        Auto => "auto",
        /// Held open: every sale is handled as if Redis were down.
        ForcedOpen => "forced_open",
        /// Held closed: every sale goes to Redis, whatever it answers.
        ForcedClosed => "forced_closed",
    }
}

/// What the breaker lets a buyer's store call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Call the store.
    Call,
    /// Call the store as the half-open probe; report the result with `probe: true`.
    Probe,
    /// Do not call the store: count it as failed.
    Skip,
}

#[derive(Debug)]
struct State {
    mode: BreakerMode,
    failures: u32,
    /// When the breaker opened; `None` while closed.
    opened_at: Option<Instant>,
    /// When the current probe started; a probe whose request vanished (never reported) is
    /// given up after one open period, so the breaker cannot stay half-open forever.
    probing: Option<Instant>,
}

pub struct Breaker {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

impl Breaker {
    /// A closed breaker in auto mode (its gauges set so).
    pub fn new(metrics: Arc<Metrics>) -> Breaker {
        let breaker = Breaker {
            state: Mutex::new(State {
                mode: BreakerMode::Auto,
                failures: 0,
                opened_at: None,
                probing: None,
            }),
            metrics,
        };
        breaker.show(&breaker.state.lock(), None);
        breaker
    }

    /// Whether a buyer's store call may go ahead now.
    pub fn pass(&self, settings: &BreakerSettings) -> Pass {
        let mut s = self.state.lock();
        match s.mode {
            BreakerMode::ForcedOpen => return Pass::Skip,
            BreakerMode::ForcedClosed => return Pass::Call,
            BreakerMode::Auto => {}
        }
        let Some(opened_at) = s.opened_at else {
            return Pass::Call;
        };
        let probe_live = s.probing.is_some_and(|at| at.elapsed() < settings.open_for);
        if opened_at.elapsed() < settings.open_for || probe_live {
            return Pass::Skip;
        }
        s.probing = Some(Instant::now());
        self.show(&s, Some(settings));
        Pass::Probe
    }

    /// Reports a store call's result (`ok`: Redis answered).
    pub fn record(&self, settings: &BreakerSettings, pass: Pass, ok: bool) {
        let mut s = self.state.lock();
        if pass == Pass::Probe {
            s.probing = None;
        }
        if ok {
            s.failures = 0;
            if s.opened_at.take().is_some() {
                tracing::info!("stock store answers again: breaker closed");
                self.show(&s, Some(settings));
            }
            return;
        }
        s.failures = s.failures.saturating_add(1);
        let reopen = pass == Pass::Probe;
        let open = s.opened_at.is_none() && s.failures >= settings.consecutive_failures;
        if reopen || open {
            s.opened_at = Some(Instant::now());
            if open {
                self.metrics.breaker_opened.inc();
                tracing::error!(
                    failures = s.failures,
                    open_ms = settings.open_for.as_millis() as u64,
                    "stock store failing: breaker open"
                );
            }
            self.show(&s, Some(settings));
        }
    }

    /// The admin switch: `Auto` hands control back to the store's answers.
    pub fn set_mode(&self, mode: BreakerMode) {
        let mut s = self.state.lock();
        s.mode = mode;
        if mode == BreakerMode::Auto {
            // Start afresh: a forced period says nothing about Redis.
            s.failures = 0;
            s.opened_at = None;
            s.probing = None;
        }
        tracing::warn!(mode = mode.as_str(), "breaker switched by the admin API");
        self.show(&s, None);
    }

    /// The state buyers would see now under `settings`, and the switch position.
    pub fn status(&self, settings: &BreakerSettings) -> (BreakerState, BreakerMode) {
        let s = self.state.lock();
        (state_of(&s, Some(settings)), s.mode)
    }

    /// Shows the state and switch position (one-hot gauges). Without settings (an admin switch),
    /// an open breaker shows as open until the next buyer's call says more.
    fn show(&self, s: &State, settings: Option<&BreakerSettings>) {
        let state = state_of(s, settings);
        for st in BreakerState::ALL {
            self.metrics
                .breaker_state
                .with_label_values(&[st.as_str()])
                .set(i64::from(*st == state));
        }
        for m in BreakerMode::ALL {
            self.metrics
                .breaker_mode
                .with_label_values(&[m.as_str()])
                .set(i64::from(*m == s.mode));
        }
    }
}

fn state_of(s: &State, settings: Option<&BreakerSettings>) -> BreakerState {
    match (s.mode, s.opened_at) {
        (BreakerMode::ForcedOpen, _) => BreakerState::Open,
        (BreakerMode::ForcedClosed, _) | (BreakerMode::Auto, None) => BreakerState::Closed,
        (BreakerMode::Auto, Some(_)) if s.probing.is_some() => BreakerState::HalfOpen,
        (BreakerMode::Auto, Some(at))
            if settings.is_some_and(|settings| at.elapsed() >= settings.open_for) =>
        {
            BreakerState::HalfOpen
        }
        (BreakerMode::Auto, Some(_)) => BreakerState::Open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SETTINGS: BreakerSettings = BreakerSettings {
        consecutive_failures: 3,
        open_for: Duration::from_millis(500),
    };

    /// The breaker under test, called as a buyer's request would be: with its generation's
    /// settings.
    struct Under(Breaker);

    impl Under {
        fn pass(&self) -> Pass {
            self.0.pass(&SETTINGS)
        }
        fn record(&self, pass: Pass, ok: bool) {
            self.0.record(&SETTINGS, pass, ok)
        }
        fn status(&self) -> (BreakerState, BreakerMode) {
            self.0.status(&SETTINGS)
        }
        fn set_mode(&self, mode: BreakerMode) {
            self.0.set_mode(mode)
        }
    }

    fn breaker() -> Under {
        Under(Breaker::new(Arc::new(Metrics::new())))
    }

    fn fail(b: &Under) {
        let pass = b.pass();
        b.record(pass, false);
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_and_probes_after_the_period() {
        let b = breaker();
        fail(&b);
        fail(&b);
        // A success in between resets the count.
        b.record(b.pass(), true);
        fail(&b);
        fail(&b);
        assert_eq!(b.pass(), Pass::Call);
        fail(&b);
        assert_eq!(b.status().0, BreakerState::Open);
        assert_eq!(b.pass(), Pass::Skip);
        tokio::time::advance(Duration::from_millis(499)).await;
        assert_eq!(b.pass(), Pass::Skip, "still inside the open period");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(b.status().0, BreakerState::HalfOpen);
        let probe = b.pass();
        assert_eq!(probe, Pass::Probe);
        assert_eq!(b.pass(), Pass::Skip, "one probe at a time");
        // A probe never reported (its request vanished) is given up after an open period.
        tokio::time::advance(Duration::from_millis(500)).await;
        let probe = b.pass();
        assert_eq!(probe, Pass::Probe);
        // The probe fails: open for a whole period again.
        b.record(probe, false);
        assert_eq!(b.pass(), Pass::Skip);
        tokio::time::advance(Duration::from_millis(500)).await;
        let probe = b.pass();
        assert_eq!(probe, Pass::Probe);
        b.record(probe, true);
        assert_eq!(b.status().0, BreakerState::Closed);
        assert_eq!(b.pass(), Pass::Call);
        // Closed again: it takes the full count of failures to reopen.
        fail(&b);
        fail(&b);
        assert_eq!(b.pass(), Pass::Call);
    }

    #[tokio::test(start_paused = true)]
    async fn the_admin_switch_holds_until_switched_back() {
        let b = breaker();
        b.set_mode(BreakerMode::ForcedOpen);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(b.pass(), Pass::Skip);
        assert_eq!(b.status(), (BreakerState::Open, BreakerMode::ForcedOpen));
        b.set_mode(BreakerMode::ForcedClosed);
        for _ in 0..10 {
            fail(&b);
        }
        assert_eq!(b.pass(), Pass::Call, "held closed whatever Redis answers");
        b.set_mode(BreakerMode::Auto);
        assert_eq!(b.status(), (BreakerState::Closed, BreakerMode::Auto));
        let text = String::from_utf8(b.0.metrics.encode()).unwrap();
        assert!(text.contains(r#"flashgate_redis_breaker_mode{mode="auto"} 1"#));
        assert!(text.contains(r#"flashgate_redis_breaker_state{state="closed"} 1"#));
    }
}
