//! What the admin listener counts: `sluice_admin_resets_total{domain}`, buckets reset through
//! `DELETE /buckets`; `sluice_admin_refused_total{reason}`, requests and connections it refused.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Meter};

/// The admin listener's instruments; empty (all no-ops) with metrics off.
#[derive(Clone, Default)]
pub struct AdminMetrics(Option<Instruments>);

#[derive(Clone)]
struct Instruments {
    resets: Counter<u64>,
    refused: Counter<u64>,
}

impl AdminMetrics {
    pub(super) fn new(meter: &Meter) -> AdminMetrics {
        AdminMetrics(Some(Instruments {
            resets: meter
                .u64_counter("sluice_admin_resets_total")
                .with_description(
                    "Buckets reset through the admin listener (DELETE /buckets answered 200), by \
                     domain",
                )
                .build(),
            refused: meter
                .u64_counter("sluice_admin_refused_total")
                .with_description(
                    "Requests and connections the admin listener refused or closed, by reason \
                     (no_token, wrong_token, foreign_host, cap, evicted, idle_timeout)",
                )
                .build(),
        }))
    }

    /// One reset of a bucket of `domain` (a configured domain, so the label is bounded).
    pub fn reset(&self, domain: &str) {
        if let Some(m) = &self.0 {
            m.resets
                .add(1, &[KeyValue::new("domain", domain.to_owned())]);
        }
    }

    /// One refusal; `reason` is one of a fixed set of names.
    pub fn refused(&self, reason: &'static str) {
        if let Some(m) = &self.0 {
            m.refused.add(1, &[KeyValue::new("reason", reason)]);
        }
    }
}
