//! `lua/master.lua`: the failover fence of one segment (see `stock::failover`). Its key, its
//! arguments and its reply, in one place; the script itself is in the registry (`super`).

use super::super::{ScriptName, StockStore, StoreError, StoreOp};
use crate::config::Activity;

/// The script's answer.
pub struct Verdict {
    /// `ok`, `armed`, `fenced` or `accepted` (see lua/master.lua).
    pub verdict: String,
    /// The identity of the master answering now.
    pub current: String,
    /// The identity recorded before this call ('' if none).
    pub recorded: String,
}

impl StockStore {
    /// Checks `record` (a segment's master record) against the master answering now, with
    /// `expected` the identity this process last saw accepted there ('' if none); `accept`:
    /// record the master answering now (an operator's resume).
    pub(in crate::stock) async fn master(
        &self,
        record: &str,
        expected: String,
        activity: &Activity,
        accept: bool,
    ) -> Result<Verdict, StoreError> {
        let mut invocation = super::MASTER.prepare_invoke();
        invocation
            .key(record)
            .arg(expected)
            .arg(self.expire_at(activity))
            .arg(if accept { "accept" } else { "" });
        let reply: Vec<String> = self
            .eval(ScriptName::Master, StoreOp::Master, &invocation)
            .await?;
        match <[String; 3]>::try_from(reply) {
            Ok([verdict, current, recorded]) => Ok(Verdict {
                verdict,
                current,
                recorded,
            }),
            Err(reply) => Err(StoreError::protocol(ScriptName::Master, reply)),
        }
    }
}
