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
        /// Resembles a sale route (see `route::resembles`) without being one.
        LookAlike => "look_alike",
    }
}

impl EdgeRefusal {
    /// What the buyer is told (400 `bad_request`).
    pub fn decision(self) -> Decision {
        Decision::BadRequest(match self {
            EdgeRefusal::LookAlike => BadRequest::LookAlikeTarget,
            _ => BadRequest::UnreadableTarget,
        })
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
    let resembles = |t: &Target| settings.sale_routes.iter().any(|r| route::resembles(r, t));
    if resembles(target) {
        return Routed::Refused(EdgeRefusal::LookAlike);
    }
    // A proxy between the gateway and the backend may decode the path again (`%252F` becoming
    // `/`, joining or splitting segments): read as they would be, up to twice more.
    let mut again = target.decoded_again();
    for _ in 0..2 {
        let Some(t) = again else { break };
        if sale_route(settings, &t).is_some() || resembles(&t) {
            return Routed::Refused(EdgeRefusal::LookAlike);
        }
        again = t.decoded_again();
    }
    Routed::Other
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
