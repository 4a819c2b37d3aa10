//! Redis key layout. Every key of one activity carries the hash tag `{<activity id>}`, so each
//! script's keys hash to one Redis Cluster slot (no CROSSSLOT). Only configured activity ids
//! appear in key names; user ids and reservation ids are hash fields and script arguments.
//!
//! ```text
//! <prefix>:{<act>}:v<n>:stock     integer  units remaining in stock version n
//! <prefix>:{<act>}:v<n>:ledger    hash     units: initial, pending, confirmed, released, retired
//! <prefix>:{<act>}:v<n>:pending   zset     jti -> hold deadline (unix ms) of pending reservations
//! <prefix>:{<act>}:versions       set      stock versions ever prewarmed
//! <prefix>:{<act>}:users          hash     user id -> units held in the activity
//! <prefix>:{<act>}:res            hash     jti -> reservation record (JSON)
//! <prefix>:{<act>}:idem           hash     user id "\n" Idempotency-Key -> jti
//! <prefix>:{<act>}:events         stream   reserve / confirm / release events
//! ```

#[derive(Debug, Clone)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    pub fn new(prefix: &str) -> Self {
        KeyLayout {
            prefix: prefix.to_owned(),
        }
    }

    fn versioned(&self, activity: &str, version: u64, what: &str) -> String {
        format!("{}:{{{activity}}}:v{version}:{what}", self.prefix)
    }

    fn activity(&self, activity: &str, what: &str) -> String {
        format!("{}:{{{activity}}}:{what}", self.prefix)
    }

    pub fn stock(&self, activity: &str, version: u64) -> String {
        self.versioned(activity, version, "stock")
    }

    pub fn ledger(&self, activity: &str, version: u64) -> String {
        self.versioned(activity, version, "ledger")
    }

    pub fn pending(&self, activity: &str, version: u64) -> String {
        self.versioned(activity, version, "pending")
    }

    pub fn versions(&self, activity: &str) -> String {
        self.activity(activity, "versions")
    }

    pub fn user_units(&self, activity: &str) -> String {
        self.activity(activity, "users")
    }

    pub fn reservations(&self, activity: &str) -> String {
        self.activity(activity, "res")
    }

    pub fn idempotency(&self, activity: &str) -> String {
        self.activity(activity, "idem")
    }

    pub fn events(&self, activity: &str) -> String {
        self.activity(activity, "events")
    }

    /// The segment count a stock version was first prewarmed with (in the activity's own tag).
    pub fn layout(&self, activity: &str, version: u64) -> String {
        self.versioned(activity, version, "segments")
    }

    /// Outgoing transfers of a segment not yet acknowledged (transfer id -> JSON).
    pub fn transfers(&self, activity: &str) -> String {
        self.activity(activity, "transfers")
    }

    /// Transfers a segment has received (transfer id -> units): deposits happen once.
    pub fn received(&self, activity: &str) -> String {
        self.activity(activity, "received")
    }

    /// The pub/sub channel of sold-out news (not a key; shared by the deployment).
    pub fn news_channel(&self) -> String {
        format!("{}:news", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').unwrap();
        let close = open + key[open..].find('}').unwrap();
        &key[open + 1..close]
    }

    #[test]
    fn all_keys_of_an_activity_share_one_hash_tag() {
        let k = KeyLayout::new("fg");
        assert_eq!(k.stock("1001", 3), "fg:{1001}:v3:stock");
        for key in [
            k.stock("1001", 3),
            k.ledger("1001", 3),
            k.pending("1001", 3),
            k.versions("1001"),
            k.user_units("1001"),
            k.reservations("1001"),
            k.idempotency("1001"),
            k.events("1001"),
        ] {
            assert_eq!(hash_tag(&key), "1001", "{key}");
        }
    }
}
