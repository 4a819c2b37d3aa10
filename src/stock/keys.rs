//! Redis key layout. Every key of one activity carries the hash tag `{<activity id>}`, so each
//! script's keys hash to one Redis Cluster slot (no CROSSSLOT). Only configured activity ids and
//! gateway-made reservation ids appear in key names; user ids travel as ARGV.
//!
//! ```text
//! <prefix>:{<act>}:v<version>:stock    integer  units remaining in that stock version
//! <prefix>:{<act>}:users               hash     user id -> units held in the activity
//! <prefix>:{<act>}:r:<reservation id>  hash     user, qty, ver, state, created_ms, ...
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

    pub fn stock(&self, activity: &str, version: u64) -> String {
        format!("{}:{{{activity}}}:v{version}:stock", self.prefix)
    }

    pub fn user_units(&self, activity: &str) -> String {
        format!("{}:{{{activity}}}:users", self.prefix)
    }

    pub fn reservation(&self, activity: &str, reservation_id: &str) -> String {
        format!("{}:{{{activity}}}:r:{reservation_id}", self.prefix)
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
            k.user_units("1001"),
            k.reservation("1001", "abc"),
        ] {
            assert_eq!(hash_tag(&key), "1001", "{key}");
        }
    }
}
