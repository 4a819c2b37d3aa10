//! Settings for the crate's unit tests: one gateway's fixed keys around the activities a test
//! names (YAML flow mappings, one per line), validated as a file would be.

use super::Settings;

/// The top-level keys every test gateway has, each one line, in order.
const DEFAULTS: [(&str, &str); 8] = [
    ("server", r#"server: { listen: "127.0.0.1:1" }"#),
    ("admin", r#"admin: { listen: "127.0.0.1:2" }"#),
    ("upstream", r#"upstream: { addresses: ["127.0.0.1:3"] }"#),
    ("redis", r#"redis: { url: "redis://127.0.0.1:4" }"#),
    ("identity", "identity: { header: X-User-Id }"),
    (
        "signing",
        "signing: { header: X-Flashgate-Reservation, algorithm: HS256, key_id: k, \
         secret_env: SECRET, ttl_secs: 900 }",
    ),
    ("sold_out_cache", "sold_out_cache: { ttl_ms: 3600000 }"),
    (
        "sale_routes",
        r#"sale_routes: [{ method: POST, path: "/buy/{activity}" }]"#,
    ),
];

/// Settings with `activities` (each line `  - { id: ..., ... }`) and the default keys; see
/// [`settings_with`].
pub fn settings(activities: &str) -> Settings {
    settings_with(&[], activities)
}

/// Settings with `activities` (each line `  - { id: ..., ... }`), the default keys (one sale
/// route `POST /buy/{activity}`, the identity header `X-User-Id`, a sold-out mark for an hour),
/// and `lines`: each a whole top-level line replacing the default of its key, or added.
pub fn settings_with(lines: &[&str], activities: &str) -> Settings {
    let key = |line: &str| line.split(':').next().unwrap_or_default().trim().to_owned();
    let mut yaml = String::new();
    for (name, default) in DEFAULTS {
        let line = lines.iter().find(|l| key(l) == name).unwrap_or(&default);
        yaml.push_str(line);
        yaml.push('\n');
    }
    for line in lines
        .iter()
        .filter(|l| !DEFAULTS.iter().any(|(n, _)| *n == key(l)))
    {
        yaml.push_str(line);
        yaml.push('\n');
    }
    yaml.push_str("activities:\n");
    yaml.push_str(activities);
    let secrets = |name: &str| (name == "SECRET").then(|| "s".repeat(32));
    Settings::from_yaml(&yaml, std::path::Path::new("."), &secrets)
        .unwrap_or_else(|e| panic!("invalid test configuration: {e}\n{yaml}"))
}
