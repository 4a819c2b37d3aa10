//! A sale route template (`sale_routes[]`, like `/api/seckill/{activity}/buy`), parsed. Which
//! requests match one is admission's business (`admission::route`).

use http::Method;

/// One segment of a route's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSegment {
    /// Matched case-insensitively.
    Literal(String),
    /// `{activity}`: the activity id.
    Activity,
}

/// One configured sale route.
#[derive(Debug, Clone)]
pub struct SaleRoute {
    method: Method,
    segments: Vec<PathSegment>,
    quantity_query: String,
}

/// The placeholder a template uses for the activity id.
const ACTIVITY_PLACEHOLDER: &str = "{activity}";

impl SaleRoute {
    /// Parses a route from its configuration. On error: the offending field and why.
    pub fn parse(
        method: &str,
        path: &str,
        quantity_query: &str,
    ) -> Result<SaleRoute, (&'static str, String)> {
        let method = Method::from_bytes(method.as_bytes())
            .ok()
            .filter(|m| m.as_str().bytes().all(|b| b.is_ascii_uppercase()))
            .ok_or_else(|| {
                (
                    "method",
                    format!("{method:?} is not an upper-case HTTP method"),
                )
            })?;
        if !path.starts_with('/') {
            return Err(("path", format!("{path:?} must start with '/'")));
        }
        let segments: Vec<PathSegment> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s == ACTIVITY_PLACEHOLDER {
                    Ok(PathSegment::Activity)
                } else if s.contains(['{', '}', '?', '#']) {
                    Err((
                        "path",
                        format!("segment {s:?}: only {ACTIVITY_PLACEHOLDER} may be a placeholder"),
                    ))
                } else {
                    Ok(PathSegment::Literal(s.to_owned()))
                }
            })
            .collect::<Result<_, _>>()?;
        if segments
            .iter()
            .filter(|s| **s == PathSegment::Activity)
            .count()
            != 1
        {
            return Err((
                "path",
                format!(
                    "{path:?} must contain {ACTIVITY_PLACEHOLDER} exactly once as a whole segment"
                ),
            ));
        }
        if quantity_query.is_empty()
            || !quantity_query
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err((
                "quantity_query",
                format!("{quantity_query:?} must be a plain query parameter name"),
            ));
        }
        Ok(SaleRoute {
            method,
            segments,
            quantity_query: quantity_query.to_owned(),
        })
    }

    /// The route's canonical path for an activity: what an admitted request is forwarded as.
    pub fn path_for(&self, activity: &str) -> String {
        let mut path = String::with_capacity(self.path_len(activity));
        self.push_path(activity, &mut path);
        path
    }

    /// The length of [`Self::path_for`]'s answer, so a caller can allocate once.
    pub fn path_len(&self, activity: &str) -> usize {
        self.segments
            .iter()
            .map(|segment| match segment {
                PathSegment::Literal(lit) => 1 + lit.len(),
                PathSegment::Activity => 1 + activity.len(),
            })
            .sum()
    }

    /// Appends [`Self::path_for`]'s answer to `path`.
    pub fn push_path(&self, activity: &str, path: &mut String) {
        for segment in &self.segments {
            path.push('/');
            match segment {
                PathSegment::Literal(lit) => path.push_str(lit),
                PathSegment::Activity => path.push_str(activity),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_path() {
        let route = SaleRoute::parse("POST", "/api/seckill/{activity}/buy", "qty").unwrap();
        assert_eq!(route.path_for("1001"), "/api/seckill/1001/buy");
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
