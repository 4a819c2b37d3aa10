//! `POST /v1/activities/{act}/halt` and `/resume`: the activity's fleet-wide stop (see
//! `crate::lifecycle::halt`). 200 with the activity's view (`"halted"`), 503 when Redis does
//! not answer (nothing changed, or the call may be repeated: both are idempotent).
//!
//! The resume route clears every fleet-wide stop an activity may be under: each is one call in
//! [`AdminApp::resume`], side by side.

use super::{error, json_response, AdminApp};
use crate::config::Activity;
use crate::stock::StoreError;
use http::{Response, StatusCode};

impl AdminApp {
    /// `POST /v1/activities/{act}/halt`.
    pub(super) async fn halt(&self, activity: &Activity) -> Response<Vec<u8>> {
        let halted = self.gw.lifecycle.set_halt(activity, true).await.map(drop);
        self.answer_stop(activity, halted).await
    }

    /// `POST /v1/activities/{act}/resume`: lifts every fleet-wide stop of the activity, one
    /// call each, answered once. First the failover fence (`stock::failover`): the Redis
    /// masters answering now are accepted, which an SRE does once `flashgate reconcile
    /// --orders` has checked what the replaced master lost; every gateway sells again within
    /// one check. Then the halt. Redis not answering: 503, and a fence not accepted lifts no
    /// halt.
    pub(super) async fn resume(&self, activity: &Activity) -> Response<Vec<u8>> {
        let lifted = match self.gw.store.accept_master(activity).await {
            Ok(()) => self.gw.lifecycle.set_halt(activity, false).await.map(drop),
            Err(e) => Err(e),
        };
        self.answer_stop(activity, lifted).await
    }

    async fn answer_stop(
        &self,
        activity: &Activity,
        done: Result<(), StoreError>,
    ) -> Response<Vec<u8>> {
        match done {
            Ok(()) => json_response(StatusCode::OK, &self.activity_view(activity).await),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &e.to_string(),
            ),
        }
    }
}
