//! What the cost-through-real-Envoy tests (`integration/costs_envoy.rs`,
//! `integration/reserve_envoy.rs`) share: domain `ai`'s one rule per tenant and its budget, the
//! ratelimit filter's `rate_limits` that check on the request path and charge the response's
//! cost once the stream is done (docs/costs.md's debt pattern), and tenant `acme`'s bucket as
//! `GET /buckets` reads it.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use crate::rls::http_get;

pub use crate::rlqs_envoy::now;

/// A budget per tenant of domain `ai`: `per_minute` tokens a minute, as many at once.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub per_minute: u64,
}

impl Budget {
    /// The bucket's capacity C.
    pub fn capacity(self) -> f64 {
        self.per_minute as f64
    }

    /// The refill rate r, tokens per second.
    pub fn per_second(self) -> f64 {
        self.per_minute as f64 / 60.0
    }

    /// C + r·T: what a tenant may be admitted over a span T.
    pub fn bound(self, span: Duration) -> f64 {
        self.capacity() + self.per_second() * span.as_secs_f64()
    }

    /// The config file of domain `ai`: key `tenant`, with `mode` (e.g. `charge: always`) and this
    /// budget per minute.
    pub fn rules(self, mode: &str) -> String {
        format!(
            "domain: ai
descriptors:
  - key: tenant
    {mode}
    rate_limit: {{unit: minute, requests_per_unit: {}}}
",
            self.per_minute
        )
    }
}

/// The filter-level `rate_limits` of the debt pattern, by `x-tenant`: may the tenant start (a
/// check that takes nothing), and after the response, charge what it cost (`x-tokens`).
pub fn check_then_charge() -> Value {
    let tenant =
        json!([{"request_headers": {"header_name": "x-tenant", "descriptor_key": "tenant"}}]);
    json!([
        {"actions": tenant, "hits_addend": {"number": 0}},
        {"actions": tenant, "apply_on_stream_done": true,
         "hits_addend": {"format": "%RESP(x-tokens)%"}}
    ])
}

/// Tenant `acme`'s bucket as `admin`'s `GET /buckets` reads it: (stored tokens, fractional;
/// remaining).
pub fn acme_bucket(admin: SocketAddr) -> (f64, u64) {
    let (status, body) = http_get(admin, "/buckets?domain=ai&descriptor=tenant=acme");
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap();
    let key = &json["keys"][0];
    let tokens = key["state"]["tokens"]
        .as_f64()
        .unwrap_or_else(|| panic!("{body}"));
    (tokens, key["remaining"].as_u64().unwrap())
}
