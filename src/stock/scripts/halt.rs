//! `lua/halt.lua`: halt or resume an activity for the whole fleet, or read whether it is halted
//! (every gateway, every 100 ms: a plain `GET` first). Its keys, arguments and replies in one place; the script itself
//! is in the registry (`super`).

use super::super::records::int;
use super::super::{Layout, ScriptName, StockStore, StoreError, StoreOp};
use crate::config::Activity;
use redis::Value;

/// Whether an activity is halted, as Redis says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    /// Halted since this time (unix ms, Redis's clock).
    Since(u64),
    Running,
}

impl Halt {
    pub fn is_halted(self) -> bool {
        matches!(self, Halt::Since(_))
    }
}

impl StockStore {
    /// The halt key, the queue hash, and the stepped admission's adm and active of `activity`
    /// (its base tag: one slot).
    fn halt_keys(&self, activity: &Activity) -> (String, String, [String; 3]) {
        let base = self.keys().base(&Layout::new(activity.id.clone(), 1));
        let [_, adm, active] = base.queue_stepped();
        (base.halt(), base.queue(), [adm, active, base.halt_fence()])
    }

    /// Halts (`halt`) or resumes the activity for the whole fleet; its waiting room's cursor
    /// stands (or runs again) in the same step. Idempotent: a second halt keeps the first one's
    /// time.
    pub async fn set_halt(&self, activity: &Activity, halt: bool) -> Result<Halt, StoreError> {
        self.call_halt(activity, if halt { "1" } else { "0" }).await
    }

    /// Halts the activity for a fence found on it (`halt`: only if it is not halted, marked as
    /// the fence's), or lifts the halt a fence made (`!halt`: only a marked one, never an
    /// operator's).
    pub async fn set_fence_halt(
        &self,
        activity: &Activity,
        halt: bool,
    ) -> Result<Halt, StoreError> {
        self.call_halt(activity, if halt { "F" } else { "f" }).await
    }

    /// Whether the activity is halted now (moving a halt's expiry with the sale's end). Every
    /// gateway asks this of every activity ten times a second: a plain `GET` answers it while
    /// the activity runs, and the script is called only for a halt (to move its expiry), so the
    /// poll costs Redis no script call at all in the usual case.
    pub async fn halted(&self, activity: &Activity) -> Result<Halt, StoreError> {
        #[cfg(feature = "fault-injection")]
        super::super::fault::before_halt_read().await;
        let (key, _, _) = self.halt_keys(activity);
        let since: Option<u64> = self
            .query(StoreOp::Halt, redis::cmd("GET").arg(key))
            .await?;
        match since {
            None => Ok(Halt::Running),
            Some(_) => self.call_halt(activity, "?").await,
        }
    }

    async fn call_halt(&self, activity: &Activity, what: &str) -> Result<Halt, StoreError> {
        let (key, queue, [adm, active, fence]) = self.halt_keys(activity);
        let mut invocation = super::HALT.prepare_invoke();
        invocation
            .key(key)
            .key(queue)
            .key(adm)
            .key(active)
            .key(fence)
            .arg(what)
            .arg(self.expire_at(activity))
            .arg(self.key_ttl_after_end.as_secs());
        let reply: Vec<Value> = self
            .eval(ScriptName::Halt, StoreOp::Halt, &invocation)
            .await?;
        match (int(reply.first()), int(reply.get(1))) {
            (Some(1), Some(since)) if since > 0 => Ok(Halt::Since(since as u64)),
            (Some(0), Some(_)) => Ok(Halt::Running),
            _ => Err(StoreError::protocol(ScriptName::Halt, reply)),
        }
    }
}
