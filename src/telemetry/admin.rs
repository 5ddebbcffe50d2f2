//! What the admin listener counts: `sluice_admin_resets_total{domain}`, buckets reset through
//! `DELETE /buckets`.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Meter};

/// The admin listener's instruments; empty (all no-ops) with metrics off.
#[derive(Clone, Default)]
pub struct AdminMetrics(Option<Counter<u64>>);

impl AdminMetrics {
    pub(super) fn new(meter: &Meter) -> AdminMetrics {
        AdminMetrics(Some(
            meter
                .u64_counter("sluice_admin_resets_total")
                .with_description(
                    "Buckets reset through the admin listener (DELETE /buckets answered 200), by \
                     domain",
                )
                .build(),
        ))
    }

    /// One reset of a bucket of `domain` (a configured domain, so the label is bounded).
    pub fn reset(&self, domain: &str) {
        if let Some(counter) = &self.0 {
            counter.add(1, &[KeyValue::new("domain", domain.to_owned())]);
        }
    }
}
