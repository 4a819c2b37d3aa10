//! Redis key layout. Every key of one segment carries its hash tag (`{<act>}`, or
//! `{<act>~<n>/<count>}` for segment n of an activity split into count segments), so each script's keys hash to one
//! Redis Cluster slot (no CROSSSLOT). Only configured activity ids appear in key names; user ids
//! and reservation ids are hash fields and script arguments. Every key expires at the sale's end
//! plus `redis.key_ttl_after_end_secs` (prewarm moves expiries later, never earlier).
//!
//! ```text
//! A variant's stock lane (see `super::layout`) puts `:~<variant>` after the tag of every key
//! below but users, idem, halt and the waiting room's, which its activity's lanes share.
//!
//! <p>:{<tag>}:meta          hash    segment: current (version on sale here), v:<n> (when
//!                                   version n went on sale here); on the base tag {<act>} also
//!                                   segments (fixed for the activity) and version (newest claimed)
//! <p>:{<tag>}:v<n>:stock    string  units of version n remaining here (only while n is on sale)
//! <p>:{<tag>}:v<n>:ledger   hash    units of version n here: initial, pending, confirmed,
//!                                   released, retired, moved_in, moved_out, unsold_retired,
//!                                   late_accepted, oversold, restocked; for the report:
//!                                   sold_out_ms (when the last unit was taken), restock@<ms>
//!                                   (units an operator added then)
//! <p>:{<tag>}:v<n>:pending  zset    jti -> when due (hold deadline, or next order lookup), ms
//! <p>:{<tag>}:users         hash    user id -> units held (all versions)
//! <p>:{<tag>}:res           hash    jti -> reservation record, with its fence (see lua/lib.lua)
//! <p>:{<tag>}:idem          hash    user id "\n" Idempotency-Key -> jti
//! <p>:{<tag>}:events        stream  reserve / confirm / release events
//! <p>:{<tag>}:transfers     hash    transfer id -> version|to|units|ms, given but not yet acknowledged
//! <p>:{<tag>}:acked         hash    the same, acknowledged (kept: they account for moved_out)
//! <p>:{<tag>}:received      hash    transfer id -> units, received (a deposit happens once)
//! <p>:{<tag>}:restocks      hash    Idempotency-Key -> version:units of each restock added here
//!                                   (a restock happens once per key; segment 0 only)
//! <p>:{<tag>}:master        string  the identity of the master the stock was accepted under, or
//!                                   `lost` (the failover fence, see lua/master.lua)
//! <p>:{<tag>}:known         hash    what the gateways know the segment must hold: the most
//!                                   records seen, the records' epoch, the accepted master's
//!                                   persistence, a loss found, the last lift and recount
//! <p>:{<act>}:v<n>:recount:<s>:<stamp>
//!                           string  a recount's claim on the loss segment s carried (stamp:
//!                                   its known's lost/fenced_at/recount): the operator's count
//! <p>:{<act>}:variants      hash    a drop's variants each version was first put on sale with
//!                                   (version -> ids), shared by its variants' lanes
//! <p>:{<act>}:floor         string  the newest version ever claimed: the one key that never
//!                                   expires (a few bytes per activity id ever sold), so no
//!                                   version that was on sale sells again after the rest expired
//! <p>:{<act>}:q             hash    the waiting room's state (cursor, rate, pause, history),
//!                                   and when each ticket call issued (a:<first number>)
//! <p>:{<act>}:q:tickets     hash    the waiting room's tickets: user -> number
//! <p>:{<tag>}:line          zset    the second-chance line: user -> place (in order of joining)
//! <p>:{<tag>}:line:holds    hash    user -> when the returned unit held for them passes on (ms)
//! <p>:{<act>}:access:<list> set     a sale's access list (user ids), loaded by `flashgate
//!                                   access load`, expiring with the sale's keys
//! <p>:{<act>}:halt          string  since when the activity is halted (unix ms; absent when
//!                                   not): expires with the sale's keys, see lua/halt.lua
//! <p>:{<act>}:halt:fence    string  the halt was made for a fence (a rule lifting it lifts it)
//! <p>:{rl~<n>}:<kind>:<h>  string  a fleet-wide token bucket (rate_limits scope: fleet): its
//!                                   GCRA arrival time (unix us); <h> is the hex FNV-1a of the
//!                                   user id or IP, <n> its shard; expires once full again
//! <p>:activities            hash    stock lane (activity id, or <id>~<variant>) -> segment count, of every lane prewarmed
//!                                   (sweeps reach removed ones too; a second record of the count)
//! ```
//!
//! Hashes and the pending sets hold a placeholder (field or member `""`; in `pending` at score
//! +inf) so that they exist, with their expiry, from prewarm on: the buyer's path then never
//! creates a key without one.

use super::layout::{Layout, Segment};

#[derive(Debug, Clone)]
pub struct KeyLayout {
    prefix: String,
}

/// The keys of one segment.
#[derive(Debug, Clone)]
pub struct SegmentKeys {
    /// `<prefix>:{<tag>}`, then `:~<variant>` for a variant's stock lane.
    base: String,
    /// `<prefix>:{<tag>}`: the activity's keys every lane of it shares (the buyers' units and
    /// idempotency keys, the halt, the waiting room).
    shared: String,
}

impl SegmentKeys {
    fn new(prefix: &str, tag: &str, variant: Option<&str>) -> SegmentKeys {
        let shared = format!("{prefix}:{{{tag}}}");
        SegmentKeys {
            base: match variant {
                Some(v) => format!("{shared}:~{v}"),
                None => shared.clone(),
            },
            shared,
        }
    }
}

impl KeyLayout {
    pub fn new(prefix: &str) -> Self {
        KeyLayout {
            prefix: prefix.to_owned(),
        }
    }

    pub fn of(&self, segment: Segment<'_>) -> SegmentKeys {
        let variant = segment.layout().variant().map(|v| &**v);
        SegmentKeys::new(&self.prefix, &segment.tag(), variant)
    }

    /// The activity's own tag `{<act>}`: its meta holds the segment count and newest version
    /// (of the lane's variant, for a variant's lane).
    pub fn base(&self, layout: &Layout) -> SegmentKeys {
        SegmentKeys::new(&self.prefix, layout.id(), layout.variant().map(|v| &**v))
    }

    /// Every activity id ever prewarmed (no hash tag: read by background work only).
    pub fn registry(&self) -> String {
        format!("{}:activities", self.prefix)
    }

    /// A fleet-wide token bucket (`lua/tokens.lua`): `kind` is the limit (`per_user`,
    /// `per_ip`), `hash` the stable hash of its key (no user id or IP in key names), `shard` the
    /// hash tag's number (one slot per shard on a cluster).
    pub fn fleet_bucket(&self, shard: u32, kind: &str, hash: u64) -> String {
        format!("{}:{{rl~{shard}}}:{kind}:{hash:016x}", self.prefix)
    }

    /// The fleet's roll (`lua/fleet.lua`), on its own tag: each gateway's last-seen time (a
    /// sorted set) and what it says of itself (a hash).
    pub fn fleet(&self) -> [String; 2] {
        [
            format!("{}:{{fleet}}:seen", self.prefix),
            format!("{}:{{fleet}}:about", self.prefix),
        ]
    }

    /// The pub/sub channel of sold-out news (not a key; shared by the deployment).
    pub fn news_channel(&self) -> String {
        format!("{}:news", self.prefix)
    }

    /// The channel a gateway process listens on only to be seen (`PUBSUB CHANNELS`): every live
    /// gateway has one, named by its presence id (see `StockStore::presence`).
    pub fn presence_channel(&self, presence: &str) -> String {
        format!("{}:presence:{presence}", self.prefix)
    }
}

impl SegmentKeys {
    fn versioned(&self, version: u64, what: &str) -> String {
        format!("{}:v{version}:{what}", self.base)
    }

    fn key(&self, what: &str) -> String {
        format!("{}:{what}", self.base)
    }

    /// A key every stock lane of the activity shares.
    fn shared(&self, what: &str) -> String {
        format!("{}:{what}", self.shared)
    }

    /// On the base tag: the version list only an older flashgate wrote (its presence refuses).
    pub fn old_versions(&self) -> String {
        self.key("versions")
    }
    /// On the base tag: a version's segment count, only an older flashgate wrote.
    pub fn old_segments(&self, version: u64) -> String {
        self.versioned(version, "segments")
    }

    /// The master this segment's stock was accepted under (the failover fence), or `lost`.
    pub fn master(&self) -> String {
        self.key("master")
    }
    /// What the gateways know this segment must hold (see `lua/master.lua`).
    pub fn known(&self) -> String {
        self.key("known")
    }

    /// On the base tag: the waiting room's state (cursor, rate, pause, history, epoch).
    pub fn queue(&self) -> String {
        self.shared("q")
    }
    /// On the base tag: the waiting room's tickets (user -> number).
    pub fn queue_tickets(&self) -> String {
        self.shared("q:tickets")
    }
    /// On the base tag: the places gateways admitted pre-queue tickets at (number -> place).
    pub fn queue_places(&self) -> String {
        self.shared("q:places")
    }
    /// On the base tag: a spent proof-of-work challenge (hex), until it expires.
    pub fn queue_solution(&self, challenge: &str) -> String {
        self.shared(&format!("q:pow:{challenge}"))
    }
    /// On the base tag: the stepped admission's seen (place -> last poll), adm (place -> when
    /// admitted, or skipped) and active (admitted, not bought, not lapsed); see
    /// `lua/queue_lib.lua`.
    pub fn queue_stepped(&self) -> [String; 3] {
        [
            self.shared("q:seen"),
            self.shared("q:adm"),
            self.shared("q:active"),
        ]
    }

    /// The second-chance line of this lane: buyers told sold out who joined (user -> place).
    pub fn line(&self) -> String {
        self.key("line")
    }
    /// The line's holds: user -> when the unit held for them passes on (unix ms).
    pub fn line_holds(&self) -> String {
        self.key("line:holds")
    }

    /// On the base tag: a named access list of a sale in phases (user ids, loaded by
    /// `flashgate access load`).
    pub fn access_list(&self, list: &str) -> String {
        self.shared(&format!("access:{list}"))
    }

    /// On the base tag: the activity's halt (admin API), for the whole fleet.
    pub fn halt(&self) -> String {
        self.shared("halt")
    }
    /// On the base tag: what the last `flashgate reconcile --orders` found (`stock::orders_check`).
    pub fn orders_check(&self) -> String {
        self.shared("orders_check")
    }
    /// On the base tag: the mark of a halt a gateway made for a fence (a rule lifting the
    /// fence lifts that halt, never an operator's).
    pub fn halt_fence(&self) -> String {
        self.shared("halt:fence")
    }

    pub fn meta(&self) -> String {
        self.key("meta")
    }
    /// On the base tag only: the newest version ever claimed (never expires).
    pub fn floor(&self) -> String {
        self.key("floor")
    }
    pub fn stock(&self, version: u64) -> String {
        self.versioned(version, "stock")
    }
    pub fn ledger(&self, version: u64) -> String {
        self.versioned(version, "ledger")
    }
    pub fn pending(&self, version: u64) -> String {
        self.versioned(version, "pending")
    }
    pub fn users(&self) -> String {
        self.shared("users")
    }
    pub fn reservations(&self) -> String {
        self.key("res")
    }
    pub fn idempotency(&self) -> String {
        self.shared("idem")
    }
    pub fn events(&self) -> String {
        self.key("events")
    }
    pub fn transfers(&self) -> String {
        self.key("transfers")
    }
    pub fn received(&self) -> String {
        self.key("received")
    }
    pub fn acknowledged(&self) -> String {
        self.key("acked")
    }
    /// On the base tag: a recount's claim on the loss `stamp` segment `segment` carried when
    /// it was read (`src/stock/segments/recount.rs`): a second recount of the same loss finds
    /// it taken. Expires with the activity's keys.
    pub fn recount_claim(&self, version: u64, segment: u32, stamp: &str) -> String {
        format!("{}:v{version}:recount:{segment}:{stamp}", self.base)
    }
    /// On the base tag, shared by a drop's variants: the variants each version was first put
    /// on sale with (version -> comma-separated ids; see `lua/claim.lua`).
    pub fn variant_sets(&self) -> String {
        self.shared("variants")
    }
    /// The book of restocks (Idempotency-Key -> what it added): the activity's, shared by a
    /// drop's variants (one key restocks one variant, see `lua/restock.lua`).
    pub fn restocks(&self) -> String {
        self.shared("restocks")
    }

    // The KEYS of each script, in the order the script declares them, are in its module
    // (`super::scripts::<name>`).
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').unwrap();
        let close = open + key[open..].find('}').unwrap();
        &key[open + 1..close]
    }

    #[test]
    fn all_keys_of_a_segment_share_one_hash_tag() {
        let k = KeyLayout::new("fg");
        let one = Layout::new(Arc::from("1001"), 1);
        let p = k.of(one.segment(0).unwrap());
        assert_eq!(p.stock(3), "fg:{1001}:v3:stock");
        let four = Layout::new(Arc::from("1001"), 4);
        let q = k.of(four.segment(2).unwrap());
        assert_eq!(q.users(), "fg:{1001~2/4}:users");
        let sized = Layout::new(Arc::from("2001"), 2).for_variant(Arc::from("42"));
        let v = k.of(sized.segment(1).unwrap());
        assert_eq!(v.stock(1), "fg:{2001~1/2}:~42:v1:stock");
        assert_eq!(
            v.users(),
            "fg:{2001~1/2}:users",
            "one buyer's units across variants"
        );
        assert_eq!(v.idempotency(), "fg:{2001~1/2}:idem");
        assert_eq!(k.base(&sized).floor(), "fg:{2001}:~42:floor");
        assert_eq!(k.base(&sized).halt(), "fg:{2001}:halt");
        for (keys, tag) in [
            (p.for_prewarm(3, &[1, 2]), "1001"),
            (q.for_prewarm(1, &[]), "1001~2/4"),
        ] {
            for key in keys {
                assert_eq!(hash_tag(&key), tag, "{key}");
            }
        }
        for key in k.for_claim(&four, 1) {
            assert_eq!(hash_tag(&key), "1001", "{key}");
        }
    }
}
