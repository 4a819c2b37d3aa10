//! `lua/fleet.lua`: a gateway says it is alive and reads who else is (the operator's console's
//! list of the fleet). Its keys, arguments and replies in one place; the script itself is in
//! the registry (`super`).

use super::super::records::{int, string};
use super::super::{ScriptName, StockStore, StoreError, StoreOp};
use redis::Value;
use std::time::Duration;

/// One gateway of the fleet as Redis last heard of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its process id (`StockStore::presence_id`).
    pub id: String,
    /// When it last said it was alive (unix ms, Redis's clock).
    pub seen_ms: u64,
    /// What it says of itself (opaque to the store).
    pub about: String,
}

/// The fleet as one beat read it: Redis's clock then, and every gateway seen within the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roll {
    pub now_ms: u64,
    pub members: Vec<Member>,
}

impl StockStore {
    /// Says this gateway is alive (with `about`, what it says of itself) and reads every gateway
    /// seen within `window`. Both keys expire `window` after the last gateway's beat.
    pub async fn fleet_beat(&self, about: &str, window: Duration) -> Result<Roll, StoreError> {
        let [seen, text] = self.keys().fleet();
        let window_ms = window.as_millis().max(1);
        let mut invocation = super::FLEET.prepare_invoke();
        invocation
            .key(seen)
            .key(text)
            .arg(self.presence_id())
            .arg(about)
            .arg(window_ms.to_string())
            .arg((window_ms * 2).to_string());
        let reply: Vec<Value> = self
            .eval(ScriptName::Fleet, StoreOp::Fleet, &invocation)
            .await?;
        roll(&reply).ok_or_else(|| StoreError::protocol(ScriptName::Fleet, reply))
    }
}

fn roll(reply: &[Value]) -> Option<Roll> {
    let (now, rest) = reply.split_first()?;
    if rest.len() % 3 != 0 {
        return None;
    }
    let members = rest
        .chunks(3)
        .map(|m| {
            Some(Member {
                id: string(m.first())?,
                seen_ms: u64::try_from(int(m.get(1))?).ok()?,
                about: string(m.get(2))?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Roll {
        now_ms: u64::try_from(int(Some(now))?).ok()?,
        members,
    })
}
