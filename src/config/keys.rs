//! Key material named by the configuration: the identity-token verification keys, the
//! reservation signing key and its published verification keys, and secrets from the
//! environment. PEM and JWT key decoding lives here and nowhere else.

use super::file::{self, SigningAlgorithm};
use super::settings::*;
use super::{header_name, ConfigError, SecretSource};
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use std::path::Path;
use std::time::Duration;

pub(super) fn jwt_identity(
    raw: file::JwtIdentitySection,
    base_dir: &Path,
    secrets: &dyn SecretSource,
) -> Result<JwtIdentitySettings, ConfigError> {
    if raw.keys.is_empty() {
        return Err(ConfigError::invalid(
            "identity.jwt.keys",
            "needs at least one key",
        ));
    }
    let mut keys: Vec<IdentityKey> = Vec::with_capacity(raw.keys.len());
    for (i, k) in raw.keys.into_iter().enumerate() {
        let at = |field: &str| format!("identity.jwt.keys[{i}].{field}");
        if k.kid.is_empty() || keys.iter().any(|other| other.kid == k.kid) {
            return Err(ConfigError::invalid(
                at("kid"),
                format!("{:?} is empty or listed twice", k.kid),
            ));
        }
        let (algorithm, key) = identity_key(&k, &at, base_dir, secrets)?;
        keys.push(IdentityKey {
            kid: k.kid,
            algorithm,
            key,
        });
    }
    if raw.claim.is_empty() {
        return Err(ConfigError::invalid(
            "identity.jwt.claim",
            "must not be empty",
        ));
    }
    if let Some(cookie) = &raw.cookie {
        if cookie.is_empty()
            || !cookie
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b";=,".contains(&b))
        {
            return Err(ConfigError::invalid(
                "identity.jwt.cookie",
                format!("{cookie:?} is not a cookie name"),
            ));
        }
    }
    Ok(JwtIdentitySettings {
        keys,
        claim: raw.claim,
        cookie: raw.cookie,
        issuer: raw.issuer,
        audience: raw.audience,
        leeway: Duration::from_secs(raw.leeway_secs),
    })
}

/// One identity key's algorithm and decoding key: a secret from the environment (HS256) or a
/// PEM public key file (RS256, EdDSA). `at` names a field of this key for errors.
fn identity_key(
    k: &file::IdentityKeySection,
    at: &dyn Fn(&str) -> String,
    base_dir: &Path,
    secrets: &dyn SecretSource,
) -> Result<(Algorithm, DecodingKey), ConfigError> {
    match k.algorithm {
        file::IdentityAlgorithm::HS256 => {
            let var = k.secret_env.as_deref().ok_or_else(|| {
                ConfigError::invalid(at("secret_env"), "is required for algorithm HS256")
            })?;
            let secret = secret(&at("secret_env"), var, secrets)?;
            let key = DecodingKey::from_secret(secret.as_bytes()).map_err(|e| {
                ConfigError::invalid(at("secret_env"), format!("unusable secret ({e})"))
            })?;
            Ok((Algorithm::HS256, key))
        }
        alg @ (file::IdentityAlgorithm::RS256 | file::IdentityAlgorithm::EdDSA) => {
            let file = k.public_key_file.as_deref().ok_or_else(|| {
                ConfigError::invalid(
                    at("public_key_file"),
                    format!("is required for algorithm {alg:?}"),
                )
            })?;
            let (path, pem) = read_key_file(&at("public_key_file"), base_dir, file)?;
            let parsed = if alg == file::IdentityAlgorithm::RS256 {
                DecodingKey::from_rsa_pem(&pem).map(|key| (Algorithm::RS256, key))
            } else {
                DecodingKey::from_ed_pem(&pem).map(|key| (Algorithm::EdDSA, key))
            };
            parsed.map_err(|e| {
                ConfigError::invalid(
                    at("public_key_file"),
                    format!("{} is not a PEM {alg:?} public key ({e})", path.display()),
                )
            })
        }
    }
}

/// A key file named at `at`, relative to the configuration's folder: its path and content.
fn read_key_file(
    at: &str,
    base_dir: &Path,
    file: &Path,
) -> Result<(std::path::PathBuf, Vec<u8>), ConfigError> {
    let path = base_dir.join(file);
    let pem = std::fs::read(&path)
        .map_err(|e| ConfigError::invalid(at, format!("cannot read {}: {e}", path.display())))?;
    Ok((path, pem))
}

pub(super) fn signing(
    raw: file::SigningSection,
    base_dir: &Path,
    secrets: &dyn SecretSource,
) -> Result<SigningSettings, ConfigError> {
    if raw.key_id.trim().is_empty() {
        return Err(ConfigError::invalid("signing.key_id", "must not be empty"));
    }
    if raw.ttl_secs == 0 {
        return Err(ConfigError::invalid(
            "signing.ttl_secs",
            "must be at least 1",
        ));
    }
    let mut published_keys = Vec::new();
    let (algorithm, key, ticket_key) = match raw.algorithm {
        SigningAlgorithm::HS256 => {
            let var = raw.secret_env.as_deref().ok_or_else(|| {
                ConfigError::invalid("signing.secret_env", "is required for algorithm HS256")
            })?;
            let secret = secret("signing.secret_env", var, secrets)?;
            let key = EncodingKey::from_secret(secret.as_bytes()).map_err(|e| {
                ConfigError::invalid("signing.secret_env", format!("unusable secret ({e})"))
            })?;
            (Algorithm::HS256, key, ticket_key(secret.as_bytes()))
        }
        SigningAlgorithm::EdDSA => {
            let (key, published, ticket) = eddsa_signing_key(&raw, base_dir)?;
            published_keys.push(published);
            (Algorithm::EdDSA, key, ticket)
        }
    };
    for (i, previous) in raw.previous_keys.iter().enumerate() {
        let published = previous_key(i, previous, &raw.key_id, &published_keys, base_dir)?;
        published_keys.push(published);
    }
    Ok(SigningSettings {
        header: header_name("signing.header", &raw.header)?,
        algorithm,
        key_id: raw.key_id,
        key,
        ttl: Duration::from_secs(raw.ttl_secs),
        published_keys,
        ticket_key,
    })
}

/// The EdDSA signing key from `signing.private_key_file`: the encoding key, its public half
/// as published, and the ticket key derived from it.
fn eddsa_signing_key(
    raw: &file::SigningSection,
    base_dir: &Path,
) -> Result<(EncodingKey, PublishedKey, [u8; 32]), ConfigError> {
    const AT: &str = "signing.private_key_file";
    let file = raw
        .private_key_file
        .as_deref()
        .ok_or_else(|| ConfigError::invalid(AT, "is required for algorithm EdDSA"))?;
    let (path, pem) = read_key_file(AT, base_dir, file)?;
    let not_a_key = |e: &dyn std::fmt::Display| {
        ConfigError::invalid(
            AT,
            format!(
                "{} is not a PKCS#8 PEM Ed25519 private key ({e})",
                path.display()
            ),
        )
    };
    let key = EncodingKey::from_ed_pem(&pem).map_err(|e| not_a_key(&e))?;
    let signing_key = std::str::from_utf8(&pem)
        .map_err(|e| not_a_key(&e))
        .and_then(|pem| {
            ed25519_dalek::SigningKey::from_pkcs8_pem(pem).map_err(|e| not_a_key(&e))
        })?;
    let published = PublishedKey {
        kid: raw.key_id.clone(),
        public_key: signing_key.verifying_key().to_bytes(),
    };
    Ok((key, published, ticket_key(&signing_key.to_bytes())))
}

/// `signing.previous_keys[i]`: a retired key still published for verification, under its own
/// kid (not the active one, not listed twice).
fn previous_key(
    i: usize,
    previous: &file::PreviousKeySection,
    active: &str,
    published: &[PublishedKey],
    base_dir: &Path,
) -> Result<PublishedKey, ConfigError> {
    let at = format!("signing.previous_keys[{i}]");
    if previous.kid.is_empty()
        || previous.kid == active
        || published.iter().any(|k| k.kid == previous.kid)
    {
        return Err(ConfigError::invalid(
            format!("{at}.kid"),
            format!(
                "{:?} is empty, the active key_id, or listed twice",
                previous.kid
            ),
        ));
    }
    let path = base_dir.join(&previous.public_key_file);
    let public_key = std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|pem| {
            ed25519_dalek::VerifyingKey::from_public_key_pem(&pem).map_err(|e| e.to_string())
        })
        .map_err(|e| {
            ConfigError::invalid(
                format!("{at}.public_key_file"),
                format!("{} is not a PEM Ed25519 public key ({e})", path.display()),
            )
        })?;
    Ok(PublishedKey {
        kid: previous.kid.clone(),
        public_key: public_key.to_bytes(),
    })
}

/// The key waiting-room tickets are signed with: derived from the reservation signing key
/// (every gateway of a fleet has it), never the signing key itself, so a ticket can never pass
/// for a reservation or the other way round.
fn ticket_key(material: &[u8]) -> [u8; 32] {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(material)
        .expect("HMAC takes a key of any length");
    mac.update(b"flashgate waiting-room ticket key v1");
    mac.finalize().into_bytes().into()
}

pub(super) fn secret(
    key: &str,
    var: &str,
    secrets: &dyn SecretSource,
) -> Result<String, ConfigError> {
    match secrets.var(var) {
        Some(value) if !value.is_empty() => Ok(value),
        Some(_) => Err(ConfigError::invalid(
            key,
            format!("environment variable {var} is empty"),
        )),
        None => Err(ConfigError::invalid(
            key,
            format!("environment variable {var} is not set"),
        )),
    }
}
