//! Settings for the crate's unit tests: one gateway's fixed keys around the activities a test
//! names (YAML flow mappings, one per line), validated as a file would be.

use super::Settings;

/// Settings with `activities` (each line `- { id: ..., ... }`, indented under `activities:`)
/// and one sale route `POST /buy/{activity}` (a `variant` query parameter for drops).
pub fn settings(activities: &str) -> Settings {
    let yaml = format!(
        r#"server: {{ listen: "127.0.0.1:1" }}
admin: {{ listen: "127.0.0.1:2" }}
upstream: {{ addresses: ["127.0.0.1:3"] }}
redis: {{ url: "redis://127.0.0.1:4" }}
identity: {{ header: X-User-Id }}
signing: {{ header: X-Flashgate-Reservation, algorithm: HS256, key_id: k, secret_env: SECRET, ttl_secs: 900 }}
sale_routes:
  - {{ method: POST, path: "/buy/{{activity}}", variant_query: variant }}
activities:
{activities}"#
    );
    let secrets = |name: &str| (name == "SECRET").then(|| "s".repeat(32));
    Settings::from_yaml(&yaml, std::path::Path::new("."), &secrets).expect("valid")
}
