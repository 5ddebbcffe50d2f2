//! What this replica's decisions did to holders, per rule: for in-flight caps, slots taken,
//! releases that freed their holder's slot, and releases that freed nothing (a refused request's,
//! or one whose slot had expired: `max_hold` was too short or a stream-done call came late);
//! slots taken and never released are the ones `max_hold` expired (or still held), so over a long
//! span `taken - released` is the rate at which releases get lost. For reservations, the same:
//! reservations made and reservations settled; `reserved - settled` lapsed (or are pending).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::algorithm::Algorithm;
use crate::config::Config;

use super::plan::{Bucket, Outcome};

/// One event of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotEvent {
    Taken,
    Released,
    ReleasedNothing,
    Reserved,
    Settled,
}

impl SlotEvent {
    /// An in-flight cap's events.
    pub const IN_FLIGHT: [SlotEvent; 3] = [
        SlotEvent::Taken,
        SlotEvent::Released,
        SlotEvent::ReleasedNothing,
    ];
    /// A reservation's events.
    pub const RESERVATION: [SlotEvent; 2] = [SlotEvent::Reserved, SlotEvent::Settled];

    pub const fn as_str(self) -> &'static str {
        match self {
            SlotEvent::Taken => "taken",
            SlotEvent::Released => "released",
            SlotEvent::ReleasedNothing => "released_nothing",
            SlotEvent::Reserved => "reserved",
            SlotEvent::Settled => "settled",
        }
    }
}

/// One rule's count of each [`SlotEvent`], and whether they are a reservation's.
type Counts = ([u64; 5], bool);

/// Counts per (domain, rule path), only for rules with `in_flight` or `reserve`.
#[derive(Default)]
pub struct SlotStats {
    by_rule: Mutex<HashMap<(String, String), Counts>>,
}

impl SlotStats {
    /// Counts what the decided in-flight buckets of one request did.
    pub(super) fn record(&self, config: &Config, buckets: &[Bucket]) {
        for bucket in buckets {
            let demand = &bucket.hit.demand;
            let Outcome::Decided(verdict) = &bucket.outcome else {
                continue;
            };
            let event = match (demand.algorithm, demand.refund, verdict.granted > 0) {
                (Algorithm::InFlight, true, true) => SlotEvent::Released,
                (Algorithm::InFlight, true, false) => SlotEvent::ReleasedNothing,
                (Algorithm::InFlight, false, true) => SlotEvent::Taken,
                // A ledger's `remaining` is the reservation it settled, `granted` the one made.
                (Algorithm::Reservation, _, true) => SlotEvent::Reserved,
                (Algorithm::Reservation, _, false) if verdict.remaining > 0 => SlotEvent::Settled,
                _ => continue,
            };
            let reservation = demand.algorithm == Algorithm::Reservation;
            let Some(rule) = bucket.hit.rule.and_then(|id| config.rule(id)) else {
                continue;
            };
            let mut map = self.by_rule.lock().unwrap_or_else(PoisonError::into_inner);
            let (counts, _) = map
                .entry((rule.domain.to_string(), rule.path.to_string()))
                .or_insert(([0; 5], reservation));
            counts[event as usize] += 1;
        }
    }

    /// Calls `points` with each rule's count of each event, its `domain`, its `key` (the rule's
    /// path below the domain, as the per-rule counters name it) and the event.
    pub fn points(&self, points: &mut dyn FnMut(u64, &str, &str, SlotEvent)) {
        let map = self.by_rule.lock().unwrap_or_else(PoisonError::into_inner);
        for ((domain, path), (counts, reservation)) in map.iter() {
            let key = path
                .strip_prefix(domain.as_str())
                .map_or(path.as_str(), |p| p.trim_start_matches('.'));
            let events: &[SlotEvent] = if *reservation {
                &SlotEvent::RESERVATION
            } else {
                &SlotEvent::IN_FLIGHT
            };
            for &event in events {
                points(counts[event as usize], domain, key, event);
            }
        }
    }
}
