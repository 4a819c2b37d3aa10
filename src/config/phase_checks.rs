//! `activities[].phases` and `activities[].second_chance`, validated: each phase against the
//! activity (in order, before its public start, within its limit), and against the `identity:`
//! section (what a phase reads of the buyer, the identity must be able to vouch for); the line
//! against the activity's layout.

use super::file::{PhaseSection, WhoSection};
use super::naming::readable_id;
use super::phases::{Phase, Who, MAX_ANY_OF, MAX_PHASES, PUBLIC};
use super::settings::{Activities, IdentitySettings, IdentitySource};
use super::ConfigError;
use chrono::{DateTime, Utc};
use std::num::NonZeroU32;
use std::sync::Arc;

/// Headers a phase may not be read from: a phase's header is removed from every untrusted
/// peer's request, and these the backend or the gateway needs from everyone.
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "idempotency-key",
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
];

/// Reads an RFC 3339 time at a key (the configuration's one way to).
pub(super) type Timestamp = fn(&str, &str) -> Result<DateTime<Utc>, ConfigError>;

/// Phases that read the buyer's identity need the identity to say it: a claim needs verified
/// tokens, a header a trusted auth layer (anyone could send it otherwise).
pub(super) fn readable(
    activities: &Activities,
    identity: &IdentitySettings,
) -> Result<(), ConfigError> {
    for a in activities.iter() {
        for p in a.phases.iter() {
            let key = super::naming::activity_key(&a.id, &format!("phases[id={}].who", p.id));
            match &p.who {
                Who::Claim { .. } if !matches!(identity.source, IdentitySource::Jwt(_)) => {
                    return Err(ConfigError::invalid(
                        format!("{key}.claim"),
                        "a claim needs verified identity tokens (identity.jwt)",
                    ))
                }
                Who::Header { name, .. } if matches!(&identity.source, IdentitySource::Header(id) if id == name) => {
                    return Err(ConfigError::invalid(
                        format!("{key}.header"),
                        "is the identity header: name the header the auth layer sets for the phase",
                    ))
                }
                Who::Header { .. } if identity.trusted_proxies.is_empty() => {
                    return Err(ConfigError::invalid(
                        format!("{key}.header"),
                        "a header phase needs identity.trusted_proxies (the auth layer that \
                         sets it): from anyone else it is stripped",
                    ))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Every phase header's name, in lower case.
pub(super) fn headers(activities: &Activities) -> Vec<String> {
    let mut names = Vec::new();
    for a in activities.iter() {
        for p in a.phases.iter() {
            if let Who::Header { name, .. } = &p.who {
                names.push(name.as_str().to_owned());
            }
        }
    }
    names
}

/// `activities[].phases`, validated against the activity's public start and limit.
pub(super) fn phases(
    raw: Vec<PhaseSection>,
    key: &dyn Fn(&str) -> String,
    public_start: DateTime<Utc>,
    per_user_limit: NonZeroU32,
    timestamp: Timestamp,
) -> Result<Arc<[Phase]>, ConfigError> {
    if raw.len() > MAX_PHASES {
        return Err(ConfigError::invalid(
            key("phases"),
            format!("{} phases: at most {MAX_PHASES}", raw.len()),
        ));
    }
    let mut out: Vec<Phase> = Vec::with_capacity(raw.len());
    for p in raw {
        let field = |f: &str| key(&format!("phases[id={}].{f}", p.id));
        if !readable_id(&p.id) || p.id.eq_ignore_ascii_case(PUBLIC) {
            return Err(ConfigError::invalid(
                key("phases[].id"),
                format!(
                    "{:?} must be 1 to 64 letters, digits, '-' or '_', and not {PUBLIC:?} \
                     (the sale after the phases)",
                    p.id
                ),
            ));
        }
        if out.iter().any(|q| *q.id == *p.id) {
            return Err(ConfigError::invalid(
                key("phases[].id"),
                format!("{:?} is used twice", p.id),
            ));
        }
        let starts_at = timestamp(&field("starts_at"), &p.starts_at)?;
        if let Some(before) = out.last().filter(|q| q.starts_at >= starts_at) {
            return Err(ConfigError::invalid(
                field("starts_at"),
                format!(
                    "must be after phase {:?}'s start (phases are in order)",
                    before.id
                ),
            ));
        }
        if starts_at >= public_start {
            return Err(ConfigError::invalid(
                field("starts_at"),
                "must be before the activity's starts_at (the public sale)",
            ));
        }
        let limit = match p.per_user_limit {
            None => None,
            Some(n) if n == 0 || n > per_user_limit.get() => {
                return Err(ConfigError::invalid(
                    field("per_user_limit"),
                    format!("must be 1 to the activity's per_user_limit ({per_user_limit})"),
                ))
            }
            Some(n) => NonZeroU32::new(n),
        };
        out.push(Phase {
            who: who(&|f| field(&format!("who.{f}")), &field("who"), p.who)?,
            id: Arc::from(p.id.as_str()),
            starts_at,
            per_user_limit: limit,
        });
    }
    Ok(out.into())
}

fn who(field: &dyn Fn(&str) -> String, whole: &str, raw: WhoSection) -> Result<Who, ConfigError> {
    let any_of = |raw: Option<Vec<String>>| -> Result<Vec<String>, ConfigError> {
        let values = raw.unwrap_or_default();
        if values.is_empty() || values.len() > MAX_ANY_OF {
            return Err(ConfigError::invalid(
                field("any_of"),
                format!("list 1 to {MAX_ANY_OF} values that qualify"),
            ));
        }
        if let Some(bad) = values.iter().find(|v| v.is_empty() || v.len() > 256) {
            return Err(ConfigError::invalid(
                field("any_of"),
                format!("{bad:?} must be 1 to 256 characters"),
            ));
        }
        Ok(values)
    };
    match (raw.claim, raw.header, raw.list) {
        (Some(claim), None, None) => {
            if claim.is_empty() {
                return Err(ConfigError::invalid(field("claim"), "must name a claim"));
            }
            Ok(Who::Claim {
                claim,
                any_of: any_of(raw.any_of)?,
            })
        }
        (None, Some(header), None) => {
            let name = super::header_name(&field("header"), &header)?;
            if RESERVED_HEADERS.contains(&name.as_str())
                || name.as_str().starts_with("x-flashgate-")
            {
                return Err(ConfigError::invalid(
                    field("header"),
                    format!(
                        "{header:?} is a header the request or the gateway needs for itself \
                         (it would be removed from every untrusted peer's request): name the \
                         header the auth layer sets for the phase"
                    ),
                ));
            }
            Ok(Who::Header {
                name,
                any_of: any_of(raw.any_of)?,
            })
        }
        (None, None, Some(list)) => {
            if raw.any_of.is_some() {
                return Err(ConfigError::invalid(
                    field("any_of"),
                    "a list phase admits the user ids in its list; any_of is for claim or header",
                ));
            }
            if !readable_id(&list) {
                return Err(ConfigError::invalid(
                    field("list"),
                    format!("{list:?} must be 1 to 64 letters, digits, '-' or '_'"),
                ));
            }
            Ok(Who::List(Arc::from(list.as_str())))
        }
        _ => Err(ConfigError::invalid(
            whole,
            "give exactly one of claim (with any_of), header (with any_of) or list",
        )),
    }
}

/// `activities[].second_chance`: its window, on an activity whose line can live with its stock.
pub(super) fn second_chance(
    raw: Option<&super::file::SecondChanceSection>,
    key: &dyn Fn(&str) -> String,
    segments: u32,
) -> Result<Option<std::time::Duration>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    if !(1..=3600).contains(&raw.window_secs) {
        return Err(ConfigError::invalid(
            key("second_chance.window_secs"),
            "must be 1 to 3600",
        ));
    }
    if segments != 1 {
        return Err(ConfigError::invalid(
            key("second_chance"),
            "needs segments: 1 (the line lives in one Redis slot with the stock it holds)",
        ));
    }
    Ok(Some(std::time::Duration::from_secs(raw.window_secs)))
}
