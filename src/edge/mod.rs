//! The edge: where a request goes, decided once from its normalised target before anything
//! else reads it, and before a purchase exists. A sale route, refused (what the gateway cannot
//! read or normalise, or what only resembles a sale route, is never passed through), or any
//! other route.

pub mod route;
pub mod target;

use crate::config::{SaleRoute, Settings};
use crate::decision::{BadRequest, Decision};
use target::Target;

/// Where a request goes, decided once, before anything else reads it (the edge fails closed).
#[derive(Debug)]
pub enum Routed<'s, 't> {
    /// A sale route, with the activity segment of its path.
    Sale(&'s SaleRoute, &'t str),
    /// Refused (400) on any route: what the gateway cannot read, it never passes through.
    Refused(EdgeRefusal),
    /// A sale route's path with a method the route neither sells on nor forwards (405): the
    /// `Allow` header's value (every method the path takes).
    WrongMethod(String),
    /// Any other route: forwarded, in its normalised form.
    Other,
}

crate::label_enum! {
    /// Why the edge refused a request before routing it (the `reason` label of
    /// `flashgate_edge_refusals_total`).
    pub enum EdgeRefusal {
        /// The decoded path is not UTF-8.
        NotUtf8 => "not_utf8",
        /// The decoded path holds a control character.
        ControlCharacter => "control_character",
        /// Deeper than `target::MAX_SEGMENTS` segments while resolving.
        TooDeep => "too_deep",
        /// Resembles a sale route (see `route::resembles`) without being one, or reads as one
        /// the way a proxy behind the gateway may read it (see [`other_readings`]).
        LookAlike => "look_alike",
        /// A sale route's path with another method (answered 405).
        WrongMethod => "wrong_method",
    }
}

impl EdgeRefusal {
    /// What the buyer is told (400 `bad_request`; 405 for another method).
    pub fn decision(self) -> Decision {
        match self {
            EdgeRefusal::WrongMethod => Decision::MethodNotAllowed,
            EdgeRefusal::LookAlike => Decision::BadRequest(BadRequest::LookAlikeTarget),
            _ => Decision::BadRequest(BadRequest::UnreadableTarget),
        }
    }
}

/// Routes a normalised request: a sale route, refused, or another route.
pub fn route<'s, 't>(settings: &'s Settings, target: &'t Target) -> Routed<'s, 't> {
    if let Err(unreadable) = &target.segments {
        return Routed::Refused(match unreadable {
            target::Unreadable::NotUtf8 => EdgeRefusal::NotUtf8,
            target::Unreadable::ControlCharacter => EdgeRefusal::ControlCharacter,
            target::Unreadable::TooDeep => EdgeRefusal::TooDeep,
        });
    }
    if let Some((route, activity)) = sale_route(settings, target) {
        return Routed::Sale(route, activity);
    }
    if let Some(allow) = wrong_method(settings, target) {
        return Routed::WrongMethod(allow);
    }
    let resembles = |t: &Target| settings.sale_routes.iter().any(|r| route::resembles(r, t));
    if resembles(target) {
        return Routed::Refused(EdgeRefusal::LookAlike);
    }
    // A proxy between the gateway and the backend may read the target otherwise: any reading
    // that is a sale route's path (whatever the method: method-agnostic handlers are common) or
    // resembles one is refused.
    let on_a_sale_path = |t: &Target| {
        settings
            .sale_routes
            .iter()
            .any(|r| route::match_path(r, t).is_some() && !r.forwards(&t.method))
    };
    if other_readings(target)
        .iter()
        .any(|t| on_a_sale_path(t) || resembles(t))
    {
        return Routed::Refused(EdgeRefusal::LookAlike);
    }
    Routed::Other
}

/// Most other readings of one target looked at (bounds the work per request).
const MAX_READINGS: usize = 24;

/// The ways a proxy or a backend behind the gateway may read a target that the gateway read
/// otherwise: its path percent-decoded once or twice more (`%252F` becoming `/`, joining or
/// splitting segments), and each of those read again with a decoded `?` or `#` as the end of
/// the path (a proxy that decodes and then parses, the Apache `mod_rewrite [P]` class) after
/// Unicode NFKC (`／ ？ ＃ ％` read as `/ ? # %`), and the paths a front controller routes by
/// from the query ([`Target::routed_by_query`]). A decoded `;` needs no reading of its own:
/// [`target`] cuts `;params` from every decoded segment already.
///
/// Approximation: four rounds of either at most (three more decodes, and the structure read
/// after the last: a target encoded five times over is not read as a chain of four decoding
/// proxies would), and at most [`MAX_READINGS`].
pub fn other_readings(target: &Target) -> Vec<Target> {
    let mut out: Vec<Target> = target.routed_by_query();
    let mut round = vec![target.clone()];
    round.extend(out.iter().cloned());
    for _ in 0..4 {
        let mut next = Vec::new();
        for t in &round {
            for reading in [t.decoded_again(), t.read_as_structure()]
                .into_iter()
                .flatten()
            {
                if reading != *target && !out.contains(&reading) && out.len() < MAX_READINGS {
                    out.push(reading.clone());
                    next.push(reading);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        round = next;
    }
    out
}

/// The `Allow` value for a target on a sale route's path with a method no route of that path
/// sells on or forwards; `None` for any other target. A CORS preflight (`OPTIONS`) is answered
/// before routing.
fn wrong_method(settings: &Settings, target: &Target) -> Option<String> {
    let on_path: Vec<&SaleRoute> = settings
        .sale_routes
        .iter()
        .filter(|r| route::match_path(r, target).is_some())
        .collect();
    if on_path.is_empty() || on_path.iter().any(|r| r.forwards(&target.method)) {
        return None;
    }
    let mut allow: Vec<&str> = Vec::new();
    for r in &on_path {
        for m in std::iter::once(r.method()).chain(r.forward_methods()) {
            if !allow.contains(&m.as_str()) {
                allow.push(m.as_str());
            }
        }
    }
    Some(allow.join(", "))
}

/// The sale route a (normalised) request is on, with its activity segment; `None` passes
/// through.
pub fn sale_route<'s, 't>(
    settings: &'s Settings,
    target: &'t Target,
) -> Option<(&'s SaleRoute, &'t str)> {
    settings
        .sale_routes
        .iter()
        .find_map(|r| route::match_target(r, target).map(|act| (r, act)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn settings(route_extra: &str) -> Settings {
        let route = format!(
            r#"sale_routes: [{{ method: POST, path: "/api/seckill/{{activity}}/buy"{route_extra} }}]"#
        );
        crate::config::testing::settings_with(
            &[&route],
            r#"  - { id: "1002", stock: 10, version: 1, per_user_limit: 1, max_per_request: 1, starts_at: "2020-01-01T00:00:00Z", ends_at: "2099-01-01T00:00:00Z" }
"#,
        )
    }

    fn routed(settings: &Settings, method: &str, raw: &str) -> String {
        let target = Target::of(
            &Method::from_bytes(method.as_bytes()).unwrap(),
            raw.as_bytes(),
        );
        match route(settings, &target) {
            Routed::Sale(_, activity) => format!("sale {activity}"),
            Routed::Refused(r) => format!("refused {}", r.as_str()),
            Routed::WrongMethod(allow) => format!("405 {allow}"),
            Routed::Other => "other".into(),
        }
    }

    #[test]
    fn no_reading_of_a_sale_route_passes_unreserved() {
        let s = settings("");
        for raw in [
            "/api/seckill/1002/buy%3Fx=1",
            "/api/seckill/1002/buy%3F",
            "/api/seckill/1002/buy%23frag",
            "/api/seckill/1002/buy%253Fx=1",
            "/api/seckill/1002/buy%25253Fx=1",
            "/api/seckill/1002/buy？x=1",
            "/api/seckill/1002/buy＃x",
            "/api／seckill／1002／buy",
            "/api/seckill/1002/buy%EF%BC%9Fx=1",
            "/api/seckill/1002/buy％3Fx=1",
        ] {
            assert_eq!(routed(&s, "POST", raw), "refused look_alike", "{raw}");
            // Another method on such a spelling is refused too (method-agnostic handlers).
            assert_eq!(routed(&s, "PUT", raw), "refused look_alike", "PUT {raw}");
        }
        // Found by the adversarial pass: a dot, a stream or an invisible character after the
        // path (IIS, .NET and Spring's suffix matching drop them), one more level of encoding,
        // IIS's `%u` escapes; and look-alikes on any other method.
        for raw in [
            "/api/seckill/1002/buy.",
            "/api/seckill/1002/buy..",
            "/api/seckill/1002/buy%2e",
            "/api/seckill/1002/buy%252e",
            "/api/seckill/1002/buy%EF%BC%8E",
            "/api./seckill/1002/buy",
            "/api/seckill/1002/buy.%20",
            "/api/seckill/1002/buy::$DATA",
            "/api/seckill/1002/buy:",
            "/api/seckill/1002/buy%E2%80%8B",
            "/api/seckill/1002/buy%EF%BB%BF",
            "/api/seckill/1002/buy%C2%AD",
            "/api/seckill/1002/buy%E1%A0%8E",
            "/api/seckill/1002/buy%2525253Fx=1",
            "/api/seckill/1002/buy%25252523",
            "/api/seckill/1002/buy%u003Fx=1",
        ] {
            for method in ["POST", "GET", "PUT"] {
                assert_eq!(
                    routed(&s, method, raw),
                    "refused look_alike",
                    "{method} {raw}"
                );
            }
        }
        for raw in [
            "/api/seckill/1002/buy.json",
            "/index.php/api/seckill/1002/buy",
        ] {
            for method in ["GET", "DELETE", "OPTIONS"] {
                assert_eq!(
                    routed(&s, method, raw),
                    "refused look_alike",
                    "{method} {raw}"
                );
            }
        }
        assert_eq!(routed(&s, "POST", "/api/seckill/1002/buy"), "sale 1002");
        for raw in [
            "/static/a%3Fb.png",
            "/api/other%3Fx",
            "/api/seckill/1002/buy/more",
        ] {
            assert_eq!(routed(&s, "POST", raw), "other", "{raw}");
        }
    }

    #[test]
    fn another_method_on_a_sale_path_is_405_unless_forwarded() {
        let s = settings("");
        for m in ["GET", "PUT", "DELETE", "PATCH", "HEAD"] {
            assert_eq!(routed(&s, m, "/api/seckill/1002/buy"), "405 POST", "{m}");
            assert_eq!(routed(&s, m, "/API/seckill/1002/buy/"), "405 POST", "{m}");
        }
        let s = settings(", forward_methods: [GET]");
        assert_eq!(routed(&s, "GET", "/api/seckill/1002/buy"), "other");
        assert_eq!(routed(&s, "PUT", "/api/seckill/1002/buy"), "405 POST, GET");
        assert_eq!(routed(&s, "GET", "/api/seckill/1002/buy%3Fx"), "other");
    }
}
