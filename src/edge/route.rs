//! Which requests are purchase attempts: a normalised request target matched against the
//! configured sale route templates.

use super::target::Target;
use crate::config::route::PathSegment;
pub use crate::config::route::SaleRoute;

/// If the (normalised) request is on this route, its activity segment. Literal segments
/// match case-insensitively: a buyer must not skip admission with a spelling the backend's
/// router reads as the purchase (see [`super::target`]).
pub fn match_target<'t>(route: &SaleRoute, target: &'t Target) -> Option<&'t str> {
    if target.method != *route.method() {
        return None;
    }
    match_path(route, target)
}

/// If the (normalised) target's path is this route's, whatever its method (a CORS preflight
/// asks about the route with `OPTIONS`), its activity segment.
pub fn match_path<'t>(route: &SaleRoute, target: &'t Target) -> Option<&'t str> {
    let parts = target.segments.as_ref().ok()?;
    if parts.len() != route.segments().len() {
        return None;
    }
    let mut activity = None;
    for (segment, part) in route.segments().iter().zip(parts) {
        match segment {
            PathSegment::Literal(lit) if lit.eq_ignore_ascii_case(part) => {}
            PathSegment::Literal(_) => return None,
            PathSegment::Activity => activity = Some(part.as_str()),
            PathSegment::Variant => {}
        }
    }
    activity
}

/// The variant segment of a target [`match_path`] matched, where the route's path has
/// `{variant}`.
pub fn path_variant<'t>(route: &SaleRoute, target: &'t Target) -> Option<&'t str> {
    let parts = target.segments.as_ref().ok()?;
    route
        .segments()
        .iter()
        .zip(parts)
        .find(|(segment, _)| **segment == PathSegment::Variant)
        .map(|(_, part)| part.as_str())
}

/// Whether a target that is no sale route still resembles one closely enough that some backend's
/// router could read it as the purchase (the caller also reads it decoded again, for a proxy
/// that decodes once more and splits segments, `%252F`): the route's method, and the route's segments at the end
/// of the target's (any prefix before them: a PHP front controller's `/index.php/...`, a
/// network-path `//host/...`, a mount point), each literal equal to the route's once both are
/// read loosely ([`loose`]: decoded again, Unicode-folded, case-folded, trimmed, without a
/// format suffix such as `.json`). Such a target is refused, never passed through: the backend
/// must never run the purchase without a reservation because it read a spelling the gateway did
/// not.
pub fn resembles(route: &SaleRoute, target: &Target) -> bool {
    // Whatever the method (handlers that take any are common), but for one the route forwards.
    if route.forwards(&target.method) {
        return false;
    }
    let Ok(parts) = target.segments.as_ref() else {
        return false;
    };
    let wanted = route.segments();
    let Some(tail) = parts
        .len()
        .checked_sub(wanted.len())
        .map(|from| &parts[from..])
    else {
        return false;
    };
    wanted
        .iter()
        .zip(tail)
        .all(|(segment, part)| match segment {
            PathSegment::Literal(lit) => loose(lit) == loose(part),
            PathSegment::Activity | PathSegment::Variant => true,
        })
}

/// Characters a lenient router (or a normalising layer in front of it, ICU's NFKC_Casefold)
/// drops: the soft hyphen, zero-width spaces and joiners, direction marks, word joiners,
/// variation selectors, the BOM, the Mongolian vowel separator, Hangul fillers, interlinear
/// annotation marks, shorthand format controls, musical formatting, tags.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{FFF9}'..='\u{FFFB}' | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D173}'..='\u{1D17A}'
        | '\u{E0000}'..='\u{E0FFF}' |
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}'
        | '\u{FFA0}')
}

/// A path segment as the most lenient router could read it: percent-decoded up to twice more
/// (a backend behind another proxy decodes again), Unicode-normalised (NFKC, then combining marks
/// and invisible characters dropped: `ｂｕｙ` and `büy` read as `buy`), case-folded as Java's
/// `equalsIgnoreCase` does too (the dotless `ı` as `i`), cut at a `:` (an NTFS stream,
/// `buy::$DATA`), surrounding whitespace trimmed, and cut at its first dot after the first
/// character (a format: Spring's suffix matching reads `buy.*`, Rails `buy.:format`; IIS and
/// .NET drop trailing dots).
fn loose(segment: &str) -> String {
    use unicode_normalization::char::is_combining_mark;
    use unicode_normalization::UnicodeNormalization;
    let mut s = segment.to_owned();
    for _ in 0..2 {
        let again =
            String::from_utf8_lossy(&super::target::percent_decode(s.as_bytes())).into_owned();
        if again == s {
            break;
        }
        s = again;
    }
    let folded: String = s
        .nfkc()
        .collect::<String>()
        .nfd()
        .filter(|c| !is_combining_mark(*c) && !invisible(*c))
        .map(|c| if c == '\u{0131}' { 'i' } else { c })
        .collect::<String>()
        .to_lowercase();
    let stem = folded.split(':').next().unwrap_or_default();
    let trimmed = stem.trim_matches(|c: char| c.is_whitespace() || c.is_control());
    let cut = match trimmed.char_indices().skip(1).find(|(_, c)| *c == '.') {
        Some((at, _)) => &trimmed[..at],
        None => trimmed,
    };
    cut.trim_end_matches(|c: char| c.is_whitespace()).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn route() -> SaleRoute {
        SaleRoute::parse("POST", "/api/seckill/{activity}/buy", "qty").unwrap()
    }

    fn matches(method: &str, raw: &str) -> Option<String> {
        let target = Target::of(
            &Method::from_bytes(method.as_bytes()).unwrap(),
            raw.as_bytes(),
        );
        match_target(&route(), &target).map(str::to_owned)
    }

    #[test]
    fn matches_the_activity_segment() {
        let some = Some("1001".to_owned());
        assert_eq!(matches("POST", "/api/seckill/1001/buy"), some);
        assert_eq!(matches("POST", "//api/seckill/1001/buy/"), some);
        assert_eq!(matches("post", "/API/Seckill/10%301/buy"), some);
        assert_eq!(matches("GET", "/api/seckill/1001/buy"), None);
        assert_eq!(matches("POST", "/api/seckill/1001/buy/x"), None);
        assert_eq!(matches("POST", "/api/seckill/1001"), None);
        assert_eq!(matches("POST", "/api/other/1001/buy"), None);
        assert_eq!(route().path_for("1001", None), "/api/seckill/1001/buy");
    }

    #[test]
    fn look_alikes_of_a_sale_route_are_recognised() {
        let resembles = |method: &str, raw: &str| {
            let target = Target::of(
                &Method::from_bytes(method.as_bytes()).unwrap(),
                raw.as_bytes(),
            );
            match_target(&route(), &target).is_none() && super::resembles(&route(), &target)
        };
        for raw in [
            "/api/seckill/1001/buy.json",
            "/api/seckill/1001/BUY.PHP",
            "/index.php/api/seckill/1001/buy",
            "//evil/api/seckill/1001/buy",
            "/mount/api/seckill/1001/buy",
            "/api/seckill/1001/bu%2579",
            "/api/seckill/1001/buy%20",
            "/api/seckill/1001/b%c3%bcy",
            "/api/seckill/1001/%EF%BD%82%EF%BD%95%EF%BD%99",
            "/api/seckill.html/1001/buy",
        ] {
            assert!(resembles("POST", raw), "{raw}");
        }
        for raw in [
            "/api/seckill/1001/buy",
            "/api/seckill/1001",
            "/api/seckill/1001/buyer",
            "/api/seckill/1001/buy/x",
            "/api/other/1001/buy",
        ] {
            assert!(!resembles("POST", raw), "{raw}");
        }
        assert!(
            resembles("GET", "/api/seckill/1001/buy.json"),
            "another method too: method-agnostic handlers are common"
        );
    }
}
