//! `lua/restock.lua`: add units to the version on sale in one segment, once per
//! `Idempotency-Key`. Its keys (in the order the script declares them), its arguments and its
//! reply, in one place; the script itself is in the registry (`super`).

use super::super::records::{int, string};
use super::super::{ScriptName, Segment, SegmentKeys, StockStore, StoreError, StoreOp};
use redis::Value;

impl SegmentKeys {
    pub fn for_restock(&self, version: u64) -> [String; 4] {
        [
            self.stock(version),
            self.ledger(version),
            self.restocks(),
            self.events(),
        ]
    }
}

/// What a restock did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestockOutcome {
    /// The units were added: `remaining` in the segment now.
    Added { remaining: u64 },
    /// This idempotency key's restock was added before: nothing changed.
    Repeated { remaining: u64 },
    /// The version is not on sale in the segment (no stock key): nothing changed.
    NotOnSale,
    /// The version's ledger is gone (the segment is damaged): nothing changed.
    Damaged,
    /// The stock (`remaining` now) or the ledger's count would pass 2^53 - 1: nothing changed.
    TooMany { remaining: u64 },
    /// The idempotency key restocked another variant of the drop (named): nothing changed.
    OtherVariant { variant: String },
}

/// The call to `lua/restock.lua`, as [`StockStore`] makes it and `stock::fake` imitates it.
pub trait RestockScript: Send + Sync {
    /// `lua/restock.lua` (see the implementation on [`StockStore`] below).
    fn restock(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        idempotency_key: Option<&str>,
        expire_at: u64,
    ) -> impl std::future::Future<Output = Result<RestockOutcome, StoreError>> + Send;
}

impl RestockScript for StockStore {
    /// Adds `units` to `version`'s stock in `segment`, counted in its ledger (`restocked`), once
    /// per `idempotency_key`; `expire_at` (unix s) is when the segment's keys expire.
    async fn restock(
        &self,
        segment: Segment<'_>,
        version: u64,
        units: u64,
        idempotency_key: Option<&str>,
        expire_at: u64,
    ) -> Result<RestockOutcome, StoreError> {
        let mut invocation = super::RESTOCK.prepare_invoke();
        for key in self.keys.of(segment).for_restock(version) {
            invocation.key(key);
        }
        invocation
            .arg(units)
            .arg(idempotency_key.unwrap_or(""))
            .arg(version)
            .arg(expire_at)
            .arg(self.events_maxlen)
            .arg(segment.layout().variant().map_or("", |v| &**v));
        let reply: Vec<Value> = self
            .eval(ScriptName::Restock, StoreOp::Restock, &invocation)
            .await?;
        let remaining = || int(reply.get(1)).map(|r| r.max(0) as u64);
        let outcome = match int(reply.first()) {
            Some(1) => remaining().map(|remaining| RestockOutcome::Added { remaining }),
            Some(0) => remaining().map(|remaining| RestockOutcome::Repeated { remaining }),
            Some(-1) => Some(RestockOutcome::NotOnSale),
            Some(-2) => Some(RestockOutcome::Damaged),
            Some(-3) => remaining().map(|remaining| RestockOutcome::TooMany { remaining }),
            Some(-4) => Some(RestockOutcome::OtherVariant {
                variant: string(reply.get(1)).unwrap_or_default(),
            }),
            _ => None,
        };
        outcome.ok_or_else(|| StoreError::protocol(ScriptName::Restock, reply))
    }
}
