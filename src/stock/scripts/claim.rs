//! `lua/claim.lua`: an activity's version floor and layout, checked and moved before a version goes
//! on sale. Its keys (in the order the script declares them), its arguments and its reply, in one
//! place; the script itself is in the registry (`super`).

use super::super::records::{int, string};
use super::super::{KeyLayout, Layout, ScriptName, StockStore, StoreError, StoreOp};
use redis::Value;

impl KeyLayout {
    /// Keys for `claim.lua`: the base meta, two keys only an older flashgate wrote, the users
    /// and res hashes of the base tag (an unsegmented activity's only segment), then the
    /// activity's floor.
    pub fn for_claim(&self, layout: &Layout, version: u64) -> [String; 7] {
        let base = self.base(layout);
        [
            base.meta(),
            base.old_versions(),
            base.old_segments(version),
            // A variant's lane: its own records (the buyers' units are the activity's).
            match layout.variant() {
                Some(_) => base.reservations(),
                None => base.users(),
            },
            base.reservations(),
            base.floor(),
            base.variant_sets(),
        ]
    }
}

/// Whether an activity's configuration agrees with what Redis recorded about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    Claimed,
    /// It was first sold with another segment count, fixed for the life of its keys.
    SegmentsFixed {
        first: u32,
    },
    /// A newer version was already prewarmed: this configuration is older.
    Older {
        newest: u64,
    },
    /// Its keys were written by an older flashgate's layout.
    OldLayout,
    /// This version was claimed before and its keys are gone (expired after the sale, or
    /// removed): it never sells again.
    SoldBefore {
        version: u64,
    },
    /// The variant is not one the version was first put on sale with (`recorded`: those).
    VariantAdded {
        recorded: String,
    },
}

impl ClaimOutcome {
    pub(super) fn parse(reply: &[Value]) -> Option<Self> {
        let value = string(reply.get(1));
        Some(match int(reply.first())? {
            1 => ClaimOutcome::Claimed,
            -1 => ClaimOutcome::SegmentsFixed {
                first: value?.parse().ok()?,
            },
            -2 => ClaimOutcome::Older {
                newest: value?.parse().ok()?,
            },
            -3 => ClaimOutcome::OldLayout,
            -4 => ClaimOutcome::SoldBefore {
                version: value?.parse().ok()?,
            },
            -5 => ClaimOutcome::VariantAdded { recorded: value? },
            _ => return None,
        })
    }
}

impl StockStore {
    /// Checks an activity's configuration against what Redis recorded on its base tag (segment
    /// count, newest version, key layout) and claims the version as the newest.
    ///
    /// `variants`: the configured variants of the activity (empty without): the first lane to
    /// claim a version records them, and a lane whose variant is not among those a version
    /// was first put on sale with is refused.
    pub async fn claim(
        &self,
        layout: &Layout,
        version: u64,
        expire_at: u64,
        variants: &[crate::config::Variant],
    ) -> Result<ClaimOutcome, StoreError> {
        let mut invocation = super::CLAIM.prepare_invoke();
        for key in self.keys.for_claim(layout, version) {
            invocation.key(key);
        }
        let set: Vec<&str> = variants.iter().map(|v| &*v.id).collect();
        invocation
            .arg(version)
            .arg(layout.count())
            .arg(expire_at)
            .arg(layout.variant().map_or("", |v| &**v))
            .arg(set.join(","));
        let reply: Vec<Value> = self
            .eval(ScriptName::Prewarm, StoreOp::Prewarm, &invocation)
            .await?;
        ClaimOutcome::parse(&reply).ok_or_else(|| StoreError::protocol(ScriptName::Prewarm, reply))
    }
}
