//! The admin API's side of a sale in phases (each phase's start and the units taken in it)
//! and of its second-chance line (who waits, what it holds, what it sold).

use super::AdminApp;
use crate::config::Activity;
use serde_json::{json, Value};

impl AdminApp {
    /// A sale's phases, each with the units taken in it (summed over its variants; null when
    /// the store cannot say), then the public sale's.
    pub(super) async fn phases_view(&self, activity: &Activity) -> Vec<Value> {
        let public = crate::config::phases::PUBLIC;
        let mut ids: Vec<&str> = activity.phases.iter().map(|p| &*p.id).collect();
        ids.push(public);
        let settings = self.gw.settings();
        let mut sold = Some(vec![0u64; ids.len()]);
        for lane in settings.activities.lanes_of(&activity.id) {
            let counts = self.gw.store.phase_sold(lane, &ids).await.ok();
            sold = sold.zip(counts).map(|(mut total, counts)| {
                total.iter_mut().zip(counts).for_each(|(t, n)| *t += n);
                total
            });
        }
        let starts = (activity.phases.iter().map(|p| p.starts_at))
            .chain([activity.starts_at])
            .collect::<Vec<_>>();
        let rows: Vec<Value> = (ids.iter().zip(starts).enumerate())
            .map(|(i, (id, starts_at))| {
                json!({
                    "id": id,
                    "starts_at": starts_at.to_rfc3339(),
                    "sold": sold.as_ref().map(|s| s[i]),
                })
            })
            .collect();
        rows
    }

    /// The second-chance line over the activity's lanes: buyers waiting, units held for the
    /// first of them, units sold through it (nulls when the store cannot say).
    pub(super) async fn line_view(&self, activity: &Activity) -> Value {
        let settings = self.gw.settings();
        let mut total = Some((0, 0, 0));
        for lane in settings.activities.lanes_of(&activity.id) {
            let figures = self.gw.store.line_figures(lane).await.ok();
            total = total
                .zip(figures)
                .map(|((w, h, s), (w2, h2, s2))| (w + w2, h + h2, s + s2));
        }
        json!({
            "waiting": total.map(|t| t.0),
            "held": total.map(|t| t.1),
            "sold": total.map(|t| t.2),
            "window_secs": activity.second_chance.map(|w| w.as_secs()),
        })
    }
}
