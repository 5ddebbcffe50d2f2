//! What the RLQS-through-real-Envoy tests (`integration/rlqs_envoy.rs`,
//! `integration/rlqs_envoy_ops.rs`) share: Envoy's `rate_limit_quota` filter in a bootstrap, the
//! tight rule they enforce, a load driver sending one user's requests through several Envoys
//! (hammering or at a steady rate), and the check of the documented bound C + r·T + slack.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Bootstrap, HttpClient, SluiceProcess};

/// Test time: a run's span is wall time; no decision reads it.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// Envoy with the `rate_limit_quota` filter for domain `edge` asking the cluster `rls` (the
/// `sluice` endpoints): one bucket per `x-user` value (`{user: <x-user>}`), reported every
/// second (Envoy reports every 5 s anyway), no fallback behaviours (Envoy's defaults: ALLOW_ALL
/// before the first assignment and once one expired).
pub fn quota_bootstrap(sluice: &[SocketAddr]) -> Bootstrap {
    let mut bootstrap = Bootstrap::rls("edge", sluice);
    let filters = bootstrap.hcm()["http_filters"].as_array_mut().unwrap();
    filters.retain(|f| f["name"] != "envoy.filters.http.ratelimit");
    let header = |name: &str| {
        json!({"name": name, "typed_config": {
            "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
            "header_name": name}})
    };
    bootstrap.insert_filter_before_router(json!({
        "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "domain": "edge",
            "rlqs_server": {"envoy_grpc": {"cluster_name": "rls"}},
            "bucket_matchers": {"matcher_list": {"matchers": [{
                "predicate": {"single_predicate": {
                    "input": header("x-user"),
                    "value_match": {"safe_regex": {"google_re2": {}, "regex": ".+"}}}},
                "on_match": {"action": {"name": "user", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
                    "bucket_id_builder": {"bucket_id_builder": {
                        "user": {"custom_value": header("x-user")}}},
                    "reporting_interval": "1s"}}}
            }]}}
        }
    }));
    bootstrap
}

/// The bucket settings of [`quota_bootstrap`]'s one matcher, to add a behaviour to.
pub fn bucket_settings(bootstrap: &mut Bootstrap) -> &mut Value {
    let filter = bootstrap.filter("envoy.filters.http.rate_limit_quota");
    let matcher = &mut filter["bucket_matchers"]["matcher_list"]["matchers"][0];
    &mut matcher["on_match"]["action"]["typed_config"]
}

/// Assignments of `kind` (`token_bucket`, `allow_all`, `deny_all`, `abandon`; "" for all) sluice
/// has sent.
pub fn assignments_sent(sluice: &SluiceProcess, kind: &str) -> f64 {
    let labels: &[(&str, &str)] = if kind.is_empty() {
        &[]
    } else {
        &[("kind", kind)]
    };
    sluice.metric("sluice_rlqs_assignments_sent_total", labels)
}

/// Waits until sluice has sent at least one token-bucket or blanket assignment.
pub fn wait_for_assignment(sluice: &SluiceProcess) {
    crate::wait_until(
        "sluice sends an assignment",
        Duration::from_secs(10),
        || assignments_sent(sluice, "") > 0.0,
    );
}

pub fn get_all(client: &mut HttpClient, headers: &[(&str, &[u8])], n: usize) -> Vec<u16> {
    (0..n).map(|_| client.get("/", headers).status).collect()
}

/// Burst 10, then 5/s, per user.
pub const TIGHT_RULE: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5, burst: 10}
"#;

/// [`TIGHT_RULE`]'s capacity C and rate r (per second).
pub const TIGHT_CAPACITY: f64 = 10.0;
pub const TIGHT_RATE: f64 = 5.0;

/// What one RLQS data plane may admit beyond C + r·T under [`TIGHT_RULE`] (docs/rlqs.md): its
/// bucket (at most the rule's capacity, 10) and rate × ttl (5 × 3), plus its first request,
/// before any assignment, under Envoy's default ALLOW_ALL.
pub const DATA_PLANE_SLACK: f64 = 10.0 + 5.0 * 3.0 + 1.0;

/// What one client of a [`drive`] sent and got.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub offered: usize,
    pub admitted: usize,
}

impl Tally {
    /// Admitted / offered (1 when nothing was offered).
    pub fn share(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.admitted as f64 / self.offered as f64
        }
    }
}

/// Sends `user`'s requests through `clients` for `run`: a client with a period sends one request
/// per period, one without as fast as the loop goes (round robin with the others, 2 ms apart).
/// What each sent and got.
pub fn drive(
    clients: &mut [HttpClient],
    periods: &[Option<Duration>],
    user: &[(&str, &[u8])],
    run: Duration,
) -> Vec<Tally> {
    assert_eq!(clients.len(), periods.len());
    let mut tallies = vec![Tally::default(); clients.len()];
    let started = now();
    let mut due = vec![started; clients.len()];
    while started.elapsed() < run {
        for (i, client) in clients.iter_mut().enumerate() {
            if let Some(period) = periods[i] {
                if now() < due[i] {
                    continue;
                }
                due[i] += period;
            }
            tallies[i].offered += 1;
            tallies[i].admitted += usize::from(client.get("/", user).status == 200);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    tallies
}

/// Sends `user`'s requests round robin through `clients` as fast as they go for 6 s; admitted
/// per client and the span in seconds.
pub fn hammer(clients: &mut [HttpClient], user: &[(&str, &[u8])]) -> (Vec<usize>, f64) {
    let started = now();
    let periods = vec![None; clients.len()];
    let tallies = drive(clients, &periods, user, Duration::from_secs(6));
    let admitted = tallies.iter().map(|t| t.admitted).collect();
    (admitted, started.elapsed().as_secs_f64())
}

/// Asserts `admitted ≤ C + r·T + slack` under [`TIGHT_RULE`] over `span` seconds, and prints
/// the share of C + r·T admitted; returns that share.
pub fn assert_within_bound(what: &str, admitted: usize, span: f64, slack: f64) -> f64 {
    let limit = TIGHT_CAPACITY + TIGHT_RATE * span;
    let share = admitted as f64 / limit;
    println!(
        "{what}: {admitted} admitted in {span:.1} s; C + r·T = {limit:.0} ({share:.2} of it), \
         bound with slack {:.0}",
        limit + slack
    );
    assert!(
        admitted as f64 <= limit + slack,
        "{what}: {admitted} > {:.0}",
        limit + slack
    );
    assert!(admitted > 0, "{what}: the limit is usable");
    share
}
