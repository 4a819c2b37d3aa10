//! Which requests are purchase attempts: a normalised request target matched against the
//! configured sale route templates.

use super::target::Target;
pub use crate::config::route::SaleRoute;
use crate::config::route::Segment;

/// If the (normalised) request is on this route, its activity segment. Literal segments
/// match case-insensitively: a buyer must not skip admission with a spelling the backend's
/// router reads as the purchase (see [`super::target`]).
pub fn match_target<'t>(route: &SaleRoute, target: &'t Target) -> Option<&'t str> {
    if target.method != *route.method() {
        return None;
    }
    let parts = target.segments.as_ref()?;
    if parts.len() != route.segments().len() {
        return None;
    }
    let mut activity = None;
    for (segment, part) in route.segments().iter().zip(parts) {
        match segment {
            Segment::Literal(lit) if lit.eq_ignore_ascii_case(part) => {}
            Segment::Literal(_) => return None,
            Segment::Activity => activity = Some(part.as_str()),
        }
    }
    activity
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
        assert_eq!(route().path_for("1001"), "/api/seckill/1001/buy");
    }
}
