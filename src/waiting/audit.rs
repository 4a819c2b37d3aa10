//! `flashgate draw --config FILE --activity ID`: the pre-queue's draw checked from what Redis
//! recorded. It reads the queue (the seed, its commitment, the tickets drawn), the arrivals (the
//! ticket each buyer was issued) and the places the gateways admitted pre-queue tickets at, then
//! recomputes every drawn place from the seed ([`super::draw::place`]) and compares:
//!
//! - the commitment recorded when the seed was chosen must be `hex(sha256(seed))`;
//! - the arrivals must hold each ticket number of the pre-queue once;
//! - every place a gateway admitted a ticket at must be the place recomputed for it.
//!
//! It says `match` when all agree, else lists what differs. (The command line's entry:
//! `reconcile::draw_cli`.)

use super::draw::{self, Seed};
use crate::config::Activity;
use crate::stock::{Layout, StockStore, StoreError, StoreOp};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// One drawn ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drawn {
    pub number: u64,
    /// The buyer it was issued to (`None`: no buyer holds it in the record).
    pub user: Option<String>,
    pub place: u64,
    /// The place a gateway admitted it at, if one did yet.
    pub recorded: Option<u64>,
}

/// What `flashgate draw` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    pub activity: String,
    /// Tickets drawn (`None`: not drawn yet).
    pub drawn: Option<u64>,
    pub seed: Option<Seed>,
    pub commitment: Option<String>,
    pub tickets: Vec<Drawn>,
    /// What differs, one line each.
    pub differences: Vec<String>,
}

impl Audit {
    pub fn matches(&self) -> bool {
        self.drawn.is_some() && self.differences.is_empty()
    }

    /// The report printed (every place, then what differs).
    pub fn report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "activity {}", self.activity);
        let Some(drawn) = self.drawn else {
            out.push_str("not drawn yet (the sale has not started)\n");
            return out;
        };
        let seed = self.seed.as_ref().map(draw::seed_hex).unwrap_or_default();
        let _ = writeln!(out, "tickets drawn {drawn}");
        let _ = writeln!(out, "seed          {seed}");
        let _ = writeln!(
            out,
            "commitment    {}",
            self.commitment.as_deref().unwrap_or("(none recorded)")
        );
        out.push_str("ticket  place  admitted at  buyer\n");
        for t in &self.tickets {
            let recorded = t.recorded.map_or("-".to_owned(), |p| p.to_string());
            let user = t.user.as_deref().unwrap_or("(none)");
            let _ = writeln!(
                out,
                "{:>6}  {:>5}  {:>11}  {user}",
                t.number, t.place, recorded
            );
        }
        for d in &self.differences {
            let _ = writeln!(out, "DIFFERS: {d}");
        }
        out
    }
}

/// Checks `activity`'s draw against the recomputation from what `store` recorded.
pub async fn audit(store: &StockStore, activity: &Activity) -> Result<Audit, StoreError> {
    let base = store.keys().base(&Layout::new(activity.id.clone(), 1));
    let read = |key: String| async move {
        store
            .redis()
            .query::<HashMap<String, String>>(StoreOp::Read, redis::cmd("HGETALL").arg(key))
            .await
    };
    // By name: the queue hash also holds a field per ticket call.
    let fields = ["drawn", "seed", "commit"];
    let values: Vec<Option<String>> = store
        .redis()
        .query(
            StoreOp::Read,
            redis::cmd("HMGET").arg(base.queue()).arg(&fields[..]),
        )
        .await?;
    let q: HashMap<String, String> = fields
        .iter()
        .zip(values)
        .filter_map(|(f, v)| Some((f.to_string(), v?)))
        .collect();
    let arrivals = read(base.queue_tickets()).await?;
    let places = read(base.queue_places()).await?;
    Ok(check(&activity.id, &q, &arrivals, &places))
}

/// The comparison itself, over the three hashes as read.
pub fn check(
    activity: &str,
    q: &HashMap<String, String>,
    arrivals: &HashMap<String, String>,
    places: &HashMap<String, String>,
) -> Audit {
    let mut audit = Audit {
        activity: activity.to_owned(),
        drawn: q.get("drawn").and_then(|d| d.parse().ok()),
        seed: q.get("seed").and_then(|s| draw::parse_seed(s)),
        commitment: q.get("commit").cloned(),
        tickets: Vec::new(),
        differences: Vec::new(),
    };
    let Some(drawn) = audit.drawn else {
        return audit;
    };
    // Drawn, but no seed to recompute from (deleted, or not 64 hex digits nor a decimal):
    // nothing can be checked, so it does not match.
    let Some(seed) = audit.seed else {
        audit.differences.push(match q.get("seed") {
            Some(raw) => {
                format!("the seed recorded ({raw}) is not a seed: no place can be checked")
            }
            None => "no seed was recorded for a drawn queue: no place can be checked".into(),
        });
        return audit;
    };
    audit.differences.extend(undrawn_places(places, drawn));
    audit
        .differences
        .extend(commitment_differs(audit.commitment.as_deref(), &seed));
    let mut holders: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for (user, number) in arrivals {
        if let Ok(n) = number.parse::<u64>() {
            holders.entry(n).or_default().push(user);
        }
    }
    for number in 1..=drawn {
        let place = draw::place(number, Some(drawn), &seed);
        let users = holders.get(&number).map(Vec::as_slice).unwrap_or_default();
        if users.len() > 1 {
            audit.differences.push(format!(
                "ticket {number} was issued to {} buyers",
                users.len()
            ));
        }
        let recorded = places.get(&number.to_string()).map(|p| p.parse::<u64>());
        let recorded = match recorded {
            Some(Ok(p)) => Some(p),
            Some(Err(_)) => {
                audit.differences.push(format!(
                    "ticket {number}: the recorded place is not a number"
                ));
                None
            }
            None => None,
        };
        if let Some(r) = recorded.filter(|r| *r != place) {
            audit.differences.push(format!(
                "ticket {number}: admitted at place {r}, the seed draws place {place}"
            ));
        }
        audit.tickets.push(Drawn {
            number,
            user: users.first().map(|u| (*u).to_owned()),
            place,
            recorded,
        });
    }
    audit
}

/// Places recorded for tickets the draw did not cover: places that differ too.
fn undrawn_places(places: &HashMap<String, String>, drawn: u64) -> Vec<String> {
    places
        .iter()
        .filter(|(number, _)| {
            !number
                .parse::<u64>()
                .is_ok_and(|n| (1..=drawn).contains(&n))
        })
        .map(|(number, place)| {
            format!(
                "ticket {number}: admitted at place {place}, but only tickets 1..={drawn} were drawn"
            )
        })
        .collect()
}

/// What is wrong with the commitment recorded for `seed`, if anything.
fn commitment_differs(commitment: Option<&str>, seed: &draw::Seed) -> Option<String> {
    match commitment {
        Some(c) if c == draw::commitment(seed) => None,
        Some(c) => Some(format!(
            "the commitment recorded ({c}) is not sha256 of the seed ({})",
            draw::commitment(seed)
        )),
        None => Some(
            "no commitment was recorded for this seed (a queue drawn by an older flashgate)".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_faithful_draw_matches_and_a_changed_seed_or_place_does_not() {
        let seed = draw::random_seed();
        let hex = draw::seed_hex(&seed);
        let commit = draw::commitment(&seed);
        let q = map(&[("drawn", "5"), ("seed", &hex), ("commit", &commit)]);
        let arrivals = map(&[
            ("a", "1"),
            ("b", "2"),
            ("c", "3"),
            ("d", "4"),
            ("e", "5"),
            ("f", "6"),
        ]);
        let p2 = draw::place(2, Some(5), &seed).to_string();
        let places = map(&[("2", &p2)]);
        let ok = check("1001", &q, &arrivals, &places);
        assert!(ok.matches(), "{}", ok.report());
        assert_eq!(ok.tickets.len(), 5);
        assert_eq!(ok.tickets[1].recorded, Some(p2.parse().unwrap()));
        // The seed changed after the commitment (a re-roll): the commitment no longer holds.
        let other = draw::seed_hex(&draw::random_seed());
        let rerolled = map(&[("drawn", "5"), ("seed", &other), ("commit", &commit)]);
        let bad = check("1001", &rerolled, &arrivals, &places);
        assert!(!bad.matches());
        assert!(
            bad.differences[0].contains("commitment"),
            "{:?}",
            bad.differences
        );
        // A gateway admitted a ticket at another place than the seed draws.
        let wrong = (p2.parse::<u64>().unwrap() % 5 + 1).to_string();
        let bad = check("1001", &q, &arrivals, &map(&[("2", &wrong)]));
        assert_eq!(bad.differences.len(), 1, "{:?}", bad.differences);
        assert!(
            bad.report().contains("DIFFERS: ticket 2"),
            "{}",
            bad.report()
        );
        // A place recorded for a ticket past the draw: it differs (it was ignored).
        let past = check("1001", &q, &arrivals, &map(&[("2", &p2), ("6", "1")]));
        assert!(!past.matches(), "{}", past.report());
        assert!(
            past.report().contains("DIFFERS: ticket 6"),
            "{}",
            past.report()
        );
        // Drawn, but the seed deleted or not a seed: nothing checked, so no match (it said
        // `match`: `flashgate draw` exited 0 with no place recomputed).
        for q in [
            map(&[("drawn", "5"), ("commit", &commit)]),
            map(&[("drawn", "5"), ("seed", "not-a-seed"), ("commit", &commit)]),
        ] {
            let none = check("1001", &q, &arrivals, &map(&[("2", &wrong)]));
            assert!(!none.matches(), "{}", none.report());
            assert!(none.report().contains("DIFFERS"), "{}", none.report());
        }
        // Not drawn yet: no match.
        assert!(!check("1001", &map(&[]), &arrivals, &places).matches());
    }
}
