//! `lua/master.lua`: the failover fence of one segment, and what the gateways know it must hold
//! (see `stock::failover`). Its keys, its arguments and its reply, in one place; the script
//! itself is in the registry (`super`).

use super::super::ScriptName;
use super::super::{Segment, StockStore, StoreError, StoreOp};
use crate::config::Activity;

/// What the call asks of the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasterCall {
    /// The periodic check (every gateway, every segment, every second).
    Check,
    /// An operator's resume: record the master answering now (refused while the segment is
    /// lost).
    Accept,
    /// A gateway found the segment's keys lost (`reason`): mark it lost, unless the segment was
    /// recounted since the finder looked (`since`: the recount stamp it saw, 0 none; `None`:
    /// whatever came since).
    Lost {
        reason: &'static str,
        since: Option<u64>,
    },
    /// `flashgate reconcile --orders` found nothing of the activity's orders missing or in
    /// doubt: recorded (a plain resume of a fence needs it, see `lua/master.lua`).
    Orders,
}

/// The script's answer.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// `ok`, `armed`, `fenced`, `lost`, `accepted`, `unchecked`, `checked` or `lifted` (see
    /// lua/master.lua).
    pub verdict: String,
    /// The identity of the master answering now.
    pub current: String,
    /// The identity recorded before this call ('' if none; `lost` once marked).
    pub recorded: String,
    /// The records the segment holds now.
    pub held: u64,
    /// Their life (see `records_of` in lua/lib.lua).
    pub life: String,
    /// Why it is lost, or the rule that lifted it.
    pub detail: String,
    /// The replicas the `WAIT` after the call saw, when it waited (see `wait` of
    /// [`StockStore::master`]).
    pub acknowledged: Option<u32>,
}

/// What this gateway passes: what it saw the segment hold, and the master's persistence.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The identity this gateway last saw accepted here ('' if none).
    pub expected: String,
    /// The most records it saw the segment hold when it acknowledged a sale, of `life`.
    pub most: u64,
    pub life: String,
    /// The newest version of a sale it acknowledged in that life (0: none).
    pub version: u64,
    /// `<appendonly>|<appendfsync>` of the master answering, as read just now ('' unknown).
    pub persistence: String,
    /// This gateway holds a fate write of the segment `redis.ack_replicas` replicas did not
    /// acknowledge (see `failover::unacked`).
    pub unacked: bool,
    /// When this gateway saw the version it sells go on sale in the segment (unix ms, Redis's
    /// clock; 0: it did not): the store holding another birth of it made it again.
    pub born: u64,
}

impl StockStore {
    /// Calls `lua/master.lua` for `segment` of `activity`; with `wait` (and
    /// `redis.ack_replicas`), followed by its `WAIT` on the same connection (the replicas it saw
    /// come back in [`Verdict::acknowledged`]).
    pub(in crate::stock) async fn master(
        &self,
        segment: Segment<'_>,
        activity: &Activity,
        seen: &Seen,
        call: MasterCall,
        wait: bool,
    ) -> Result<Verdict, StoreError> {
        let keys = self.keys.of(segment);
        let mode = match call {
            MasterCall::Check => String::new(),
            MasterCall::Accept => "accept".to_owned(),
            MasterCall::Orders => "orders".to_owned(),
            MasterCall::Lost {
                reason,
                since: None,
            } => format!("lost:{reason}"),
            MasterCall::Lost {
                reason,
                since: Some(at),
            } => format!("lost:{reason}:{at}"),
        };
        let mut cmd = super::super::client::evalsha(&super::MASTER, 4);
        cmd.arg(keys.master())
            .arg(keys.known())
            .arg(keys.reservations())
            .arg(keys.meta())
            .arg(&seen.expected)
            .arg(self.expire_at(activity))
            .arg(mode)
            .arg(seen.most)
            .arg(&seen.life)
            .arg(&seen.persistence)
            .arg(self.ack_replicas)
            .arg(self.fence_settle.as_millis() as u64)
            .arg(activity.version)
            .arg(seen.version)
            .arg(if seen.unacked { "1" } else { "" })
            .arg(seen.born);
        let (script, op) = (ScriptName::Master, StoreOp::Master);
        let (reply, acknowledged): (Vec<String>, Option<u32>) = if wait && self.ack_replicas > 0 {
            // The call writes (`unacked`): the WAIT after it covers every write before it.
            let (reply, acked) = self
                .redis
                .eval_cmd_acknowledged(
                    script,
                    &super::MASTER,
                    op,
                    &cmd,
                    self.ack_replicas,
                    self.ack_wait_ms(),
                )
                .await?;
            (reply, Some(acked))
        } else {
            let reply = self
                .redis
                .once_more(true, || {
                    self.redis.eval_cmd(script, &super::MASTER, op, &cmd)
                })
                .await?;
            (reply, None)
        };
        match <[String; 6]>::try_from(reply) {
            Ok([verdict, current, recorded, held, life, detail]) => Ok(Verdict {
                verdict,
                current,
                recorded,
                held: held.parse().unwrap_or(0),
                life,
                detail,
                acknowledged,
            }),
            Err(reply) => Err(StoreError::protocol(ScriptName::Master, reply)),
        }
    }

    /// `<appendonly>|<appendfsync>` of the master holding `segment` (`CONFIG GET`), or '' when
    /// Redis refuses to say (a managed Redis hiding CONFIG: then no rule lifts a fence).
    pub(in crate::stock) async fn persistence(&self, segment: Segment<'_>) -> String {
        let record = self.keys.of(segment).master();
        let reply: Result<Vec<String>, StoreError> = self
            .redis
            .query_at(
                StoreOp::Read,
                &record,
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("appendonly")
                    .arg("appendfsync"),
            )
            .await;
        let Ok(pairs) = reply else {
            return String::new();
        };
        let value = |name: &str| {
            pairs
                .chunks(2)
                .find(|p| p.first().map(String::as_str) == Some(name))
                .and_then(|p| p.get(1).cloned())
        };
        match (value("appendonly"), value("appendfsync")) {
            (Some(aof), Some(fsync)) => format!("{aof}|{fsync}"),
            _ => String::new(),
        }
    }
}
