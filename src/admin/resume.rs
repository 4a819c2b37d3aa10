//! `POST /v1/activities/{act}/resume`: an operator puts a stopped activity back on sale. Here:
//! a fenced activity (its Redis master was replaced, `stock::failover`) once its orders were
//! checked (`flashgate reconcile --orders`): the masters answering now are accepted and the
//! activity sells again, on every gateway within one check. 200 with the activity's view; 503
//! when Redis does not answer (nothing accepted).
//! (A halt, another stop, is lifted by this same call where it exists.)

use super::{error, json_response, AdminApp};
use crate::config::Activity;
use http::{Response, StatusCode};

impl AdminApp {
    pub(super) async fn resume(&self, activity: &Activity) -> Response<Vec<u8>> {
        if let Err(e) = self.gw.store.accept_master(activity).await {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &format!("the Redis masters were not accepted: {e}"),
            );
        }
        json_response(StatusCode::OK, &self.activity_view(activity).await)
    }
}
