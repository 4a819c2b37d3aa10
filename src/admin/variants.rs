//! The admin API's side of a drop's variants: which stock lane a call names, and the
//! activity's view over its lanes.

use super::{error, AdminApp};
use crate::config::Activity;
use http::{Response, StatusCode};
use serde_json::{json, Value};

/// The stock lane of `activity` a body's `"variant"` names: required on an activity with
/// variants (400 without it, 404 `unknown_variant` for one it does not sell), refused on one
/// without (400).
pub(super) fn lane_named<'s>(
    settings: &'s crate::config::Settings,
    activity: &Activity,
    variant: Option<&str>,
) -> Result<&'s std::sync::Arc<Activity>, Box<Response<Vec<u8>>>> {
    let refused = match (activity.has_variants(), variant) {
        (true, None) => bad_request(&format!(
            "{} sells variants: name one (\"variant\": \"<id>\")",
            activity.id
        )),
        (false, Some(_)) => bad_request(&format!("{} has no variants: name none", activity.id)),
        (_, variant) => match settings.activities.lane(&activity.id, variant) {
            Some(lane) => return Ok(lane),
            None => error(
                StatusCode::NOT_FOUND,
                "unknown_variant",
                "the activity sells no such variant",
            ),
        },
    };
    Err(Box::new(refused))
}

/// The `"variant"` of a JSON object body, if any: a string (400 otherwise).
pub(super) fn variant_of(body: &[u8]) -> Result<Option<String>, &'static str> {
    const SHAPE: &str = "\"variant\" must be a variant id (a string)";
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    match value.get("variant") {
        None => Ok(None),
        Some(Value::String(v)) => Ok(Some(v.clone())),
        Some(_) => Err(SHAPE),
    }
}

/// An activity with variants: the first lane's view for what the activity shares (its
/// settings, halt), the sums of the lanes' figures at the top level (null where any lane's is),
/// and each lane's in `variants`.
pub(super) fn variants_view(activity: &Activity, lanes: Vec<Value>) -> Value {
    let sum = |field: &str| -> Value {
        lanes
            .iter()
            .map(|l| l[field].as_i64())
            .sum::<Option<i64>>()
            .map_or(Value::Null, Value::from)
    };
    let first_of = |field: &str| -> Value {
        lanes
            .iter()
            .map(|l| l[field].clone())
            .find(|v| !v.is_null())
            .unwrap_or(Value::Null)
    };
    let mut view = lanes.first().cloned().unwrap_or_else(|| json!({}));
    for field in [
        "remaining",
        "pending",
        "held_in_doubt",
        "confirmed",
        "released",
        "retired",
        "restocked",
    ] {
        view[field] = sum(field);
    }
    view["stock"] = json!(activity.stock);
    view["sold_out"] = match lanes
        .iter()
        .map(|l| l["sold_out"].as_bool())
        .collect::<Option<Vec<bool>>>()
    {
        Some(all) => json!(all.iter().all(|s: &bool| *s)),
        None => Value::Null,
    };
    view["sold_out_cached"] = json!(lanes.iter().all(|l| l["sold_out_cached"] == json!(true)));
    for field in ["refused", "fenced", "fence_lifted"] {
        view[field] = first_of(field);
    }
    view["versions"] = Value::Null;
    view["variants"] = Value::Array(
        activity
            .variants
            .iter()
            .zip(&lanes)
            .map(|(v, l)| {
                json!({
                    "id": &*v.id,
                    "title": v.title,
                    "stock": v.stock,
                    "remaining": l["remaining"],
                    "pending": l["pending"],
                    "held_in_doubt": l["held_in_doubt"],
                    "confirmed": l["confirmed"],
                    "released": l["released"],
                    "retired": l["retired"],
                    "restocked": l["restocked"],
                    "sold_out": l["sold_out"],
                    "sold_out_cached": l["sold_out_cached"],
                    "refused": l["refused"],
                    "fenced": l["fenced"],
                    "versions": l["versions"],
                })
            })
            .collect(),
    );
    view
}

impl AdminApp {
    /// `/v1/activities/{act}/reservations/{id}…`: the variant's lane the id names. One removed
    /// since (or the activity's own lane from before it gained variants) still answers for
    /// what Redis holds of it.
    pub(super) async fn reservation_of(
        &self,
        activity: &Activity,
        id: &str,
        method: &http::Method,
        rest: &[&str],
    ) -> Response<Vec<u8>> {
        let settings = self.gw.settings();
        let variant = crate::reservation::Reservation::variant_of(id);
        match settings.activities.lane_or_former(&activity.id, variant) {
            Some(lane) => self.reservation(&lane, id, method, rest).await,
            None => error(
                StatusCode::NOT_FOUND,
                "unknown_reservation",
                "no such reservation",
            ),
        }
    }
}

fn bad_request(message: &str) -> Response<Vec<u8>> {
    error(StatusCode::BAD_REQUEST, "bad_request", message)
}
