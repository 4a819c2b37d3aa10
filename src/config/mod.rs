//! Configuration in two layers: [`file`] is the YAML as written, [`Settings`] is what the gateway
//! runs on (addresses parsed, durations typed, quotas non-zero, secrets read, keys decoded).
//! [`Settings::load`] is the only way from one to the other, so a running gateway never holds an
//! unchecked value, and `flashgate check` reports exactly what `serve` would refuse.

mod bounds;
pub mod cors;
pub mod defence;
pub mod file;
mod identity;
mod keys;
pub mod live_queue;
mod naming;
pub mod pages;
mod phase_checks;
pub mod phases;
mod rate;
pub mod route;
pub mod schema;
mod scope;
mod settings;
#[cfg(test)]
pub mod testing;
pub mod transition;
mod validate;
mod variants;

pub use cors::CorsSettings;
pub use pages::{ActivityPage, PagesSettings};
pub use phases::{Phase, Who};
pub use scope::Scope;
pub use settings::*;

use http::HeaderName;
use std::path::{Path, PathBuf};

/// Why a configuration was refused. Messages name the offending key (`activities[id=1001].stock`:
/// an activity by its id), and the line where the YAML parser knows it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Syntax(#[from] serde_yaml::Error),
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
    /// The parser's message with its activity named by id (see [`name_activity`]).
    #[error("{0}")]
    Parse(String),
}

impl ConfigError {
    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// A header name from the configuration, or an error naming `key`.
fn header_name(key: &str, value: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(value.as_bytes()).map_err(|_| {
        ConfigError::invalid(key, format!("{value:?} is not a valid HTTP header name"))
    })
}

/// Where secrets come from: the process environment in production, a map in tests.
pub trait SecretSource {
    fn var(&self, name: &str) -> Option<String>;
}

/// Reads secrets from the process environment.
pub struct ProcessEnv;

impl SecretSource for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<F: Fn(&str) -> Option<String>> SecretSource for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// The text of a configuration file.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

impl Settings {
    /// Reads, parses and validates a configuration file; secrets from the process environment.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        Settings::from_file_text(path, &read(path)?)
    }

    /// Parses and validates `text`, read from `path` (relative paths in it resolve against the
    /// file's directory); secrets from the process environment.
    pub fn from_file_text(path: &Path, text: &str) -> Result<Settings, ConfigError> {
        let base_dir = path.parent().unwrap_or(Path::new("."));
        Settings::from_yaml(text, base_dir, &ProcessEnv)
    }

    /// Like [`Settings::load`], for tools that only read Redis (`flashgate reconcile`): secrets
    /// the environment does not provide are replaced by a placeholder, so an operator needs
    /// only the configuration file, not the gateway's signing and admin secrets.
    pub fn load_without_secrets(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base_dir = path.parent().unwrap_or(Path::new("."));
        let placeholder = |name: &str| {
            Some(std::env::var(name).unwrap_or_else(|_| "not-needed-by-this-command".to_owned()))
        };
        Settings::from_yaml(&text, base_dir, &placeholder)
    }

    /// Like [`Settings::load`], for `flashgate check` (in CI, without the gateway's secrets):
    /// every secret variable the environment does not provide is replaced by a placeholder and
    /// named in the second value, for a warning.
    pub fn load_for_check(path: &Path) -> Result<(Settings, Vec<String>), ConfigError> {
        struct Noting(std::sync::Mutex<Vec<String>>);
        impl SecretSource for Noting {
            fn var(&self, name: &str) -> Option<String> {
                Some(std::env::var(name).unwrap_or_else(|_| {
                    let mut missing = self.0.lock().unwrap_or_else(|p| p.into_inner());
                    if !missing.iter().any(|m| m == name) {
                        missing.push(name.to_owned());
                    }
                    "placeholder-for-flashgate-check-0123456789".to_owned()
                }))
            }
        }
        let text = read(path)?;
        let base_dir = path.parent().unwrap_or(Path::new("."));
        let noting = Noting(std::sync::Mutex::new(Vec::new()));
        let settings = Settings::from_yaml(&text, base_dir, &noting)?;
        let missing = noting.0.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok((settings, missing))
    }

    /// Parses and validates YAML text. Relative file paths in it resolve against `base_dir`.
    pub fn from_yaml(
        text: &str,
        base_dir: &Path,
        secrets: &dyn SecretSource,
    ) -> Result<Settings, ConfigError> {
        let raw: file::FileConfig =
            serde_yaml::from_str(text).map_err(|e| name_activity(text, e))?;
        Settings::validate(raw, base_dir, secrets)
    }
}

/// The parser names an activity by its index (`activities[1].stock: invalid type ...`): named
/// by its id instead (`activities[id=1001].stock: ...`) where the file says it, as every other
/// error does; the index stays when the id is what cannot be read.
fn name_activity(text: &str, err: serde_yaml::Error) -> ConfigError {
    let message = err.to_string();
    let by_id = (|| {
        let (index, tail) = message.strip_prefix("activities[")?.split_once(']')?;
        let index: usize = index.parse().ok()?;
        if tail.starts_with(".id") && !tail.starts_with(".id.") {
            return None;
        }
        let doc: serde_yaml::Value = serde_yaml::from_str(text).ok()?;
        let id = doc.get("activities")?.get(index)?.get("id")?.as_str()?;
        naming::readable_id(id).then(|| format!("activities[id={id}]{tail}"))
    })();
    match by_id {
        Some(message) => ConfigError::Parse(message),
        None => ConfigError::Syntax(err),
    }
}
