//! The reloadable part of a gateway: one validated configuration and what is built from it
//! (admission policy, reservation signer), published as a whole.
//!
//! A request takes the current [`Generation`] once, in its first phase, and keeps it to the end:
//! a reload never changes the rules, activity or signing key of a request already in flight.
//! Background tasks read the current generation each time they run.

use crate::client_policy::{Policy, Rules};
use crate::config::Settings;
use crate::reservation::Signer;
use arc_swap::ArcSwap;
use std::sync::Arc;

/// One configuration as the gateway runs it.
pub struct Generation {
    /// 1 for the configuration the process started with, +1 per applied reload.
    pub number: u64,
    pub settings: Arc<Settings>,
    pub policy: Policy,
    pub signer: Signer,
    /// Requests of other routes at the backend (`upstream.max_passthrough_inflight`); a reload
    /// starts a new count (requests in flight keep their slot of the old one).
    pub passthrough_slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Kibibytes of other routes' bodies the gateway may hold at once
    /// (`server.max_passthrough_buffered_bytes`).
    pub passthrough_buffer: Arc<tokio::sync::Semaphore>,
    /// The buyer's pages (templates of `pages.dir` or built in), as this configuration has them.
    pub pages: crate::pages::Pages,
}

impl Generation {
    /// Builds a generation; token buckets whose quota did not change are carried over from
    /// `previous`, so a reload does not hand every buyer a full bucket.
    pub fn build(settings: Arc<Settings>, previous: Option<&Generation>) -> Generation {
        Generation {
            number: previous.map_or(1, |p| p.number + 1),
            policy: Policy::new(&settings, previous.map(|p| &p.policy)),
            signer: Signer::new(&settings.signing),
            passthrough_slots: settings
                .upstream
                .max_passthrough_inflight
                .map(|n| Arc::new(tokio::sync::Semaphore::new(n.get()))),
            passthrough_buffer: Arc::new(tokio::sync::Semaphore::new(
                (settings.server.max_passthrough_buffered_bytes / 1024)
                    .min(tokio::sync::Semaphore::MAX_PERMITS as u64) as usize,
            )),
            pages: crate::pages::Pages::new(&settings.pages),
            settings,
        }
    }
}

impl Generation {
    /// Activity `id`'s page keys, as its pages name it.
    pub fn sale_page<'a>(&'a self, id: &'a str) -> crate::pages::Sale<'a> {
        crate::pages::Sale {
            id,
            page: self.settings.pages.activity(id),
        }
    }

    /// What admission reads from this generation.
    pub fn rules(&self) -> Rules<'_> {
        Rules {
            settings: &self.settings,
            policy: &self.policy,
        }
    }
}

/// The current generation, shared by everything that reads configuration.
#[derive(Clone)]
pub struct Live(Arc<Shared>);

struct Shared {
    current: ArcSwap<Generation>,
    /// Held (shared) by each background pass, (exclusive) by a switch: a pass that read one
    /// generation finishes before the next is published, so nothing it writes (a gauge of an
    /// activity a reload removed) lands after the switch.
    passes: tokio::sync::RwLock<()>,
}

/// The longest a reload waits for the background pass in flight (see [`Live::switch`]).
pub const SWITCH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// One background pass's hold on the current generation: no switch happens until it is dropped.
pub type Pass<'a> = tokio::sync::RwLockReadGuard<'a, ()>;

impl Live {
    pub fn new(first: Generation) -> Live {
        Live(Arc::new(Shared {
            current: ArcSwap::from_pointee(first),
            passes: tokio::sync::RwLock::new(()),
        }))
    }

    /// The current generation, to keep for the length of a request.
    pub fn current(&self) -> Arc<Generation> {
        self.0.current.load_full()
    }

    /// The current settings.
    pub fn settings(&self) -> Arc<Settings> {
        self.0.current.load().settings.clone()
    }

    /// Starts a background pass (a maintenance tick): the generation stays current until the
    /// pass is dropped. A pass must not start another (a switch waiting between them would
    /// deadlock it).
    pub async fn pass(&self) -> Pass<'_> {
        self.0.passes.read().await
    }

    /// Makes `next` current once the passes in flight have finished, then runs `after` (with
    /// the previous generation) before any new pass starts; requests that already hold the
    /// previous generation keep it. Approximation: a pass that takes longer than
    /// [`SWITCH_WAIT`] (Redis timing out call after call) is not waited for: the switch goes
    /// ahead, and what that pass writes of a removed activity (a gauge) may come back.
    pub async fn switch(&self, next: Generation, after: impl FnOnce(&Generation, &Generation)) {
        let no_pass = tokio::time::timeout(SWITCH_WAIT, self.0.passes.write()).await;
        if no_pass.is_err() {
            tracing::warn!(
                waited_ms = SWITCH_WAIT.as_millis() as u64,
                "a reload did not wait for a slow maintenance pass (Redis slow or away)"
            );
        }
        let previous = self.0.current.swap(Arc::new(next));
        after(&previous, &self.0.current.load());
    }

    /// Makes `next` current at once, for a process that runs no background passes (a test's
    /// pipeline). Panics if a pass is in flight, rather than switching under it.
    pub fn publish(&self, next: Generation) {
        let _no_pass = self
            .0
            .passes
            .try_write()
            .expect("publish: no background pass in flight");
        self.0.current.store(Arc::new(next));
    }
}
