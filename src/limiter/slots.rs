//! What this replica's decisions did to in-flight caps' slots, per rule: slots taken, releases
//! that freed their holder's slot, and releases that freed nothing (a refused request's, or one
//! whose slot had expired: `max_hold` was too short or a stream-done call came late). Slots
//! taken and never released are the ones `max_hold` expired (or still held): over a long span,
//! `taken - released` is the rate at which releases get lost.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use opentelemetry::KeyValue;

use crate::algorithm::Algorithm;
use crate::config::Config;

use super::plan::{Bucket, Outcome};

/// One event of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotEvent {
    Taken,
    Released,
    ReleasedNothing,
}

impl SlotEvent {
    pub const ALL: [SlotEvent; 3] = [
        SlotEvent::Taken,
        SlotEvent::Released,
        SlotEvent::ReleasedNothing,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            SlotEvent::Taken => "taken",
            SlotEvent::Released => "released",
            SlotEvent::ReleasedNothing => "released_nothing",
        }
    }
}

/// Counts per (domain, rule path), only for rules with `in_flight`.
#[derive(Default)]
pub struct SlotStats {
    by_rule: Mutex<HashMap<(String, String), [u64; 3]>>,
}

impl SlotStats {
    /// Counts what the decided in-flight buckets of one request did.
    pub(super) fn record(&self, config: &Config, buckets: &[Bucket]) {
        for bucket in buckets {
            let demand = &bucket.hit.demand;
            if demand.algorithm != Algorithm::InFlight {
                continue;
            }
            let Outcome::Decided(verdict) = &bucket.outcome else {
                continue;
            };
            let event = match (demand.refund, verdict.granted > 0) {
                (true, true) => SlotEvent::Released,
                (true, false) => SlotEvent::ReleasedNothing,
                (false, true) => SlotEvent::Taken,
                (false, false) => continue,
            };
            let Some(rule) = bucket.hit.rule.and_then(|id| config.rule(id)) else {
                continue;
            };
            let mut map = self.by_rule.lock().unwrap_or_else(PoisonError::into_inner);
            let counts = map
                .entry((rule.domain.to_string(), rule.path.to_string()))
                .or_default();
            counts[event as usize] += 1;
        }
    }

    /// Calls `points` with each rule's count of each event, labelled `domain`, `key` (the rule's
    /// path below the domain, as the per-rule counters name it) and `event`.
    pub fn points(&self, points: &mut dyn FnMut(u64, &[KeyValue])) {
        let map = self.by_rule.lock().unwrap_or_else(PoisonError::into_inner);
        for ((domain, path), counts) in map.iter() {
            let key = path
                .strip_prefix(domain.as_str())
                .map_or(path.as_str(), |p| p.trim_start_matches('.'));
            for event in SlotEvent::ALL {
                let labels = [
                    KeyValue::new("domain", domain.clone()),
                    KeyValue::new("key", key.to_owned()),
                    KeyValue::new("event", event.as_str()),
                ];
                points(counts[event as usize], &labels);
            }
        }
    }
}
