//! `lua/tokens.lua`: token buckets shared by every gateway (`rate_limits` with `scope: fleet`),
//! a batch of asks in one call. Its keys, arguments and reply in one place; the script itself
//! is in the registry (`super`).

use super::super::{ScriptName, StockStore, StoreError, StoreOp};
use crate::coalesce::Batcher;
use std::sync::Arc;

/// Asks waiting per shard, each answered on its own.
pub(crate) type TokenBatches = Batcher<u32, TokenAsk, Result<Tokens, Arc<StoreError>>>;

/// Most asks one call carries.
pub const MAX_TOKEN_BATCH: usize = 64;

/// Shards fleet buckets are spread over on a Redis Cluster (a hash tag each, so each call's keys
/// share one slot and the load spreads over masters); one Redis has one.
const CLUSTER_TOKEN_SHARDS: u32 = 16;

/// One token asked of a fleet bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenAsk {
    /// The limit's name (`per_user`, `per_ip`): part of the key.
    pub kind: &'static str,
    /// The stable hash of the bucket's key (user id, IP).
    pub hash: u64,
    /// Microseconds a token (1e6 / per_second).
    pub interval_us: u64,
    pub burst: u32,
}

/// A bucket's answer to one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub granted: bool,
    /// Microseconds until the bucket would grant a token next (0: now).
    pub next_in_us: u64,
}

impl StockStore {
    /// How many shards fleet buckets are spread over.
    pub fn token_shards(&self) -> u32 {
        if self.redis().is_cluster() {
            CLUSTER_TOKEN_SHARDS
        } else {
            1
        }
    }

    /// Asks one token of a fleet bucket. Asks of one shard that arrive while a call of it is
    /// out go together in the next call (up to [`MAX_TOKEN_BATCH`]): one call per batch of
    /// decisions.
    pub async fn take_token(&self, ask: TokenAsk) -> Result<Tokens, StoreError> {
        let shard = (ask.hash % u64::from(self.token_shards())) as u32;
        let answer = self
            .token_batches
            .submit(shard, ask, |asks| async move {
                let n = asks.len();
                match self.take_tokens(shard, &asks).await {
                    Ok(answers) => answers.into_iter().map(Ok).collect(),
                    Err(e) => {
                        let e = Arc::new(e);
                        (0..n).map(|_| Err(e.clone())).collect()
                    }
                }
            })
            .await?;
        answer.map_err(StoreError::shared)
    }

    /// Asks one token of each bucket in `asks` (all of `shard`), in order: one script call.
    async fn take_tokens(&self, shard: u32, asks: &[TokenAsk]) -> Result<Vec<Tokens>, StoreError> {
        let mut invocation = super::TOKENS.prepare_invoke();
        for ask in asks {
            invocation
                .key(self.keys().fleet_bucket(shard, ask.kind, ask.hash))
                .arg(ask.interval_us)
                .arg(ask.burst);
        }
        let reply: Vec<u64> = self
            .eval(ScriptName::Tokens, StoreOp::Tokens, &invocation)
            .await?;
        if reply.len() != 2 * asks.len() {
            return Err(StoreError::protocol(ScriptName::Tokens, reply));
        }
        Ok(reply
            .chunks(2)
            .map(|pair| Tokens {
                granted: pair[0] == 1,
                next_in_us: pair[1],
            })
            .collect())
    }
}
