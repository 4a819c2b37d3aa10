//! A sale route template (`sale_routes[]`, like `/api/seckill/{activity}/buy`), parsed. Which
//! requests match one is the edge's business (`edge::route`).

use http::Method;

/// One segment of a route's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSegment {
    /// Matched case-insensitively.
    Literal(String),
    /// `{activity}`: the activity id.
    Activity,
    /// `{variant}`: the variant bought, of an activity with variants.
    Variant,
}

/// One configured sale route.
#[derive(Debug, Clone)]
pub struct SaleRoute {
    method: Method,
    segments: Vec<PathSegment>,
    quantity_query: String,
    /// The query parameter naming the variant, if the path has no `{variant}`.
    variant_query: Option<String>,
    /// Other methods on the route's path forwarded to the backend unreserved (any other is
    /// answered 405).
    forward_methods: Vec<Method>,
}

/// The placeholder a template uses for the activity id.
const ACTIVITY_PLACEHOLDER: &str = "{activity}";
/// The placeholder a template uses for the variant id.
const VARIANT_PLACEHOLDER: &str = "{variant}";

/// Whether `name` is a plain query parameter name.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl SaleRoute {
    /// Parses a route from its configuration. On error: the offending field and why.
    pub fn parse(
        method: &str,
        path: &str,
        quantity_query: &str,
    ) -> Result<SaleRoute, (&'static str, String)> {
        Self::parse_with_variant(method, path, quantity_query, None)
    }

    /// [`Self::parse`], with the route's `variant_query`.
    pub fn parse_with_variant(
        method: &str,
        path: &str,
        quantity_query: &str,
        variant_query: Option<&str>,
    ) -> Result<SaleRoute, (&'static str, String)> {
        let method = known_method(method).map_err(|why| ("method", why))?;
        let segments = path_segments(path)?;
        if !plain_name(quantity_query) {
            return Err((
                "quantity_query",
                format!("{quantity_query:?} must be a plain query parameter name"),
            ));
        }
        let variant_in_path = segments.contains(&PathSegment::Variant);
        if let Some(name) = variant_query {
            variant_query_of(name, quantity_query, variant_in_path)?;
        }
        Ok(SaleRoute {
            method,
            segments,
            quantity_query: quantity_query.to_owned(),
            variant_query: variant_query.map(str::to_owned),
            forward_methods: Vec::new(),
        })
    }

    /// Forwards `methods` on the route's path unreserved (see the field). On error: why.
    pub fn with_forward_methods(mut self, methods: &[String]) -> Result<SaleRoute, String> {
        for (i, m) in methods.iter().enumerate() {
            let method = known_method(m).map_err(|why| format!("[{i}]: {why}"))?;
            if method == self.method {
                return Err(format!(
                    "[{i}]: {m} is the route's own method: a purchase is never forwarded unreserved"
                ));
            }
            if self.forward_methods.contains(&method) {
                return Err(format!("[{i}]: {m} is listed twice"));
            }
            self.forward_methods.push(method);
        }
        Ok(self)
    }

    /// The methods forwarded unreserved on the route's path.
    pub fn forward_methods(&self) -> &[Method] {
        &self.forward_methods
    }

    /// Whether `method` on the route's path is forwarded unreserved.
    pub fn forwards(&self, method: &Method) -> bool {
        self.forward_methods.contains(method)
    }

    /// The query parameter naming the variant, if the route names it in the query.
    pub fn variant_query(&self) -> Option<&str> {
        self.variant_query.as_deref()
    }

    /// Whether the route can name a variant at all (in its path or its query).
    pub fn names_variants(&self) -> bool {
        self.variant_query.is_some() || self.segments.contains(&PathSegment::Variant)
    }

    /// The route's canonical path for an activity (and its variant, where the path names
    /// one): what an admitted request is forwarded as.
    pub fn path_for(&self, activity: &str, variant: Option<&str>) -> String {
        let mut path = String::with_capacity(self.path_len(activity, variant));
        self.push_path(activity, variant, &mut path);
        path
    }

    /// The length of [`Self::path_for`]'s answer, so a caller can allocate once.
    pub fn path_len(&self, activity: &str, variant: Option<&str>) -> usize {
        self.segments
            .iter()
            .map(|segment| match segment {
                PathSegment::Literal(lit) => 1 + lit.len(),
                PathSegment::Activity => 1 + activity.len(),
                PathSegment::Variant => 1 + variant.map_or(0, str::len),
            })
            .sum()
    }

    /// Appends [`Self::path_for`]'s answer to `path`.
    pub fn push_path(&self, activity: &str, variant: Option<&str>, path: &mut String) {
        for segment in &self.segments {
            path.push('/');
            match segment {
                PathSegment::Literal(lit) => path.push_str(lit),
                PathSegment::Activity => path.push_str(activity),
                PathSegment::Variant => path.push_str(variant.unwrap_or_default()),
            }
        }
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The path's segments, in order.
    pub fn segments(&self) -> &[PathSegment] {
        &self.segments
    }

    pub fn quantity_query(&self) -> &str {
        &self.quantity_query
    }

    pub fn same_pattern(&self, other: &SaleRoute) -> bool {
        self.method == other.method && self.segments == other.segments
    }
}

/// An upper-case method of RFC 9110, or PATCH: a typo ("PSOT") would be a route no buyer's
/// request matches, every purchase passed through without a reservation.
fn known_method(method: &str) -> Result<Method, String> {
    const KNOWN: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"];
    Method::from_bytes(method.as_bytes())
        .ok()
        .filter(|m| KNOWN.contains(&m.as_str()))
        .ok_or_else(|| {
            format!(
                "{method:?} is not an upper-case HTTP method (one of {})",
                KNOWN.join(", ")
            )
        })
}

/// A route template's path, parsed: `{activity}` exactly once, `{variant}` at most once, no
/// other placeholder.
fn path_segments(path: &str) -> Result<Vec<PathSegment>, (&'static str, String)> {
    if !path.starts_with('/') {
        return Err(("path", format!("{path:?} must start with '/'")));
    }
    let segments: Vec<PathSegment> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s == ACTIVITY_PLACEHOLDER {
                Ok(PathSegment::Activity)
            } else if s == VARIANT_PLACEHOLDER {
                Ok(PathSegment::Variant)
            } else if s.contains(['{', '}', '?', '#']) {
                Err((
                    "path",
                    format!(
                        "segment {s:?}: only {ACTIVITY_PLACEHOLDER} and {VARIANT_PLACEHOLDER} may be placeholders"
                    ),
                ))
            } else {
                Ok(PathSegment::Literal(s.to_owned()))
            }
        })
        .collect::<Result<_, _>>()?;
    let count = |which: &PathSegment| segments.iter().filter(|s| *s == which).count();
    if count(&PathSegment::Activity) != 1 {
        return Err((
            "path",
            format!("{path:?} must contain {ACTIVITY_PLACEHOLDER} exactly once as a whole segment"),
        ));
    }
    if count(&PathSegment::Variant) > 1 {
        return Err((
            "path",
            format!("{path:?} may contain {VARIANT_PLACEHOLDER} once at most"),
        ));
    }
    Ok(segments)
}

/// A route's `variant_query`: a plain name, not the quantity's, and not beside `{variant}`.
fn variant_query_of(
    name: &str,
    quantity_query: &str,
    variant_in_path: bool,
) -> Result<(), (&'static str, String)> {
    if !plain_name(name) {
        return Err((
            "variant_query",
            format!("{name:?} must be a plain query parameter name"),
        ));
    }
    if name == quantity_query {
        return Err((
            "variant_query",
            format!("{name:?} is the quantity_query too: name the variant with another parameter"),
        ));
    }
    if variant_in_path {
        return Err((
            "variant_query",
            format!("the path names the variant ({VARIANT_PLACEHOLDER}): a variant_query would be a second spelling of it"),
        ));
    }
    Ok(())
}

/// `sale_routes`, validated: each template parsed, none listed twice.
pub(super) fn validate_all(
    raw: Vec<super::file::SaleRouteSection>,
) -> Result<Vec<SaleRoute>, super::ConfigError> {
    let mut routes: Vec<SaleRoute> = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let route = SaleRoute::parse_with_variant(
            &r.method,
            &r.path,
            &r.quantity_query,
            r.variant_query.as_deref(),
        )
        .map_err(|(field, reason)| {
            super::ConfigError::invalid(format!("sale_routes[{i}].{field}"), reason)
        })?
        .with_forward_methods(&r.forward_methods)
        .map_err(|reason| {
            super::ConfigError::invalid(format!("sale_routes[{i}].forward_methods"), reason)
        })?;
        if routes.iter().any(|other| other.same_pattern(&route)) {
            return Err(super::ConfigError::invalid(
                format!("sale_routes[{i}].path"),
                format!("{} {} is listed twice", r.method, r.path),
            ));
        }
        routes.push(route);
    }
    Ok(routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_path() {
        let route = SaleRoute::parse("POST", "/api/seckill/{activity}/buy", "qty").unwrap();
        assert_eq!(route.path_for("1001", None), "/api/seckill/1001/buy");
        let sized =
            SaleRoute::parse("POST", "/api/seckill/{activity}/{variant}/buy", "qty").unwrap();
        assert_eq!(
            sized.path_for("2001", Some("42")),
            "/api/seckill/2001/42/buy"
        );
        assert!(sized.names_variants());
    }
    #[test]
    fn rejects_bad_variant_names() {
        for (path, variant_query) in [
            ("/{activity}/{variant}/{variant}", None),
            ("/{activity}/{variant}", Some("variant")),
            ("/{activity}", Some("qty")),
            ("/{activity}", Some("v&x")),
        ] {
            assert!(
                SaleRoute::parse_with_variant("POST", path, "qty", variant_query).is_err(),
                "{path} {variant_query:?}"
            );
        }
    }
    #[test]
    fn rejects_bad_templates() {
        assert_eq!(
            SaleRoute::parse("POST", "api/{activity}", "qty")
                .unwrap_err()
                .0,
            "path"
        );
        assert_eq!(
            SaleRoute::parse("POST", "/api/buy", "qty").unwrap_err().0,
            "path"
        );
        assert_eq!(
            SaleRoute::parse("POST", "/{activity}/{activity}", "qty")
                .unwrap_err()
                .0,
            "path"
        );
        assert_eq!(
            SaleRoute::parse("POST", "/x{activity}", "qty")
                .unwrap_err()
                .0,
            "path"
        );
        assert_eq!(
            SaleRoute::parse("post", "/{activity}", "qty")
                .unwrap_err()
                .0,
            "method"
        );
        assert_eq!(
            SaleRoute::parse("POST", "/{activity}", "q&x")
                .unwrap_err()
                .0,
            "quantity_query"
        );
    }
}
