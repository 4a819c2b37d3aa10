//! The configuration file's JSON Schema (draft 2020-12), generated from the serde types the
//! gateway parses the file with ([`super::file::FileConfig`]), so it cannot drift from them:
//! every key with its type, whether it is required, its default, its allowed values, the bounds
//! written on the field, and its doc comment as the description. `flashgate schema` prints it;
//! an editor's YAML language server checks `gateway.yaml` against it as it is typed.
//!
//! Approximation: the schema knows the file's shape, not its rules across keys (an activity's
//! `ends_at` after its `starts_at`, a route's `{activity}`, secrets that must be set, addresses
//! that must parse): a file the schema accepts can still be refused by `flashgate check`, never
//! the other way round (tests/config.rs checks every shipped and every valid fixture).

use super::file::FileConfig;
use schemars::generate::SchemaSettings;

/// The schema, as a JSON value.
pub fn json_schema() -> serde_json::Value {
    let mut schema = SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<FileConfig>();
    schema.insert(
        "title".into(),
        "flashgate configuration (gateway.yaml)".into(),
    );
    schema.to_value()
}

/// The schema as `flashgate schema` prints it: pretty JSON, one trailing line break.
pub fn json_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema()).expect("a JSON value prints");
    text.push('\n');
    text
}
