//! One suite of scenarios for every algorithm (token bucket, fixed window, sliding window, GCRA,
//! and requests mixing them), written once over any [`Backend`] whose clock the test holds, run
//! against every backend: memory, Redis standalone and Redis Cluster. Plus a differential test:
//! random request sequences over keys of all four algorithms give identical verdicts (and
//! identical stored state, to the bit) from the Lua script and from the pure `algorithm::decide`.
//!
//! Each backend runs all scenarios on one server (scenarios use disjoint keys); a failing
//! scenario is reported by name and the others still run.
//!
//! This file: the subject, the hit and verdict builders, the suite and its runs. The scenarios,
//! by theme: [`token_bucket`], [`windows`] (fixed, sliding, GCRA, several units), [`requests`]
//! (several algorithms in one call, leases, byte values, always-charged takes), [`in_flight`],
//! [`reserve`].
//! The differential tests: [`differential`].

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use sluice::algorithm::{Algorithm, BucketParams, Verdict};
use sluice::backend::memory::{MemoryBackend, MemoryOptions};
use sluice::backend::redis::{RedisBackend, RedisMode, RedisOptions};
use sluice::backend::{Backend, Hit};
use sluice::clock::ManualClock;

mod differential;
mod in_flight;
mod requests;
mod reserve;
mod token_bucket;
mod windows;

use in_flight::{a_full_cap_takes_nothing_elsewhere, slots_are_held_released_and_expire};
use requests::*;
use reserve::{reservations_settle, reservations_settle_on_gcra};
use sluice_harness::{RedisCluster, RedisServer};
use token_bucket::*;
use windows::*;

/// Start of every scenario's timeline: a realistic epoch in ms, so large-number precision counts.
const T0: u64 = 1_700_000_000_000;
const YEAR_MS: u64 = 365 * 86_400_000;

/// A backend under test and the hand that sets its clock.
struct Subject<B> {
    name: &'static str,
    backend: B,
    clock: ManualClock,
}

impl<B: Backend> Subject<B> {
    async fn check(&self, hits: &[Hit]) -> Vec<Verdict> {
        self.backend
            .check(hits)
            .await
            .unwrap_or_else(|err| panic!("{}: check failed: {err}", self.name))
    }

    /// Checks `hits` and requires exactly `expected`, except `granted` (what a take took), which
    /// [`Subject::expect_granted`] and the differential test check.
    async fn expect(&self, hits: &[Hit], expected: &[Verdict]) {
        let mut got = self.check(hits).await;
        for verdict in &mut got {
            verdict.granted = 0;
        }
        assert_eq!(got, expected, "{}: verdicts for {hits:#?}", self.name);
    }

    /// Checks `hits` and requires exactly `expected`, `granted` included.
    async fn expect_granted(&self, hits: &[Hit], expected: &[Verdict]) {
        let got = self.check(hits).await;
        assert_eq!(got, expected, "{}: verdicts for {hits:#?}", self.name);
    }
}

fn params(capacity: u64, requests_per_unit: u64, unit_ms: u64) -> BucketParams {
    BucketParams {
        capacity,
        requests_per_unit,
        unit_ms,
    }
}

fn take(key: &str, params: BucketParams, tokens: u64) -> Hit {
    Hit::new(key, params, tokens)
}

fn refund(key: &str, params: BucketParams, tokens: u64) -> Hit {
    let mut hit = Hit::new(key, params, tokens);
    hit.demand.refund = true;
    hit
}

fn shadow(key: &str, params: BucketParams, tokens: u64) -> Hit {
    let mut hit = Hit::new(key, params, tokens);
    hit.demand.shadow = true;
    hit
}

fn window(key: &str, algorithm: Algorithm, limit: u64, unit_ms: u64, tokens: u64) -> Hit {
    Hit::new(key, params(limit, limit, unit_ms), tokens).using(algorithm)
}

fn fixed(key: &str, limit: u64, unit_ms: u64, tokens: u64) -> Hit {
    window(key, Algorithm::FixedWindow, limit, unit_ms, tokens)
}

fn sliding(key: &str, limit: u64, unit_ms: u64, tokens: u64) -> Hit {
    window(key, Algorithm::SlidingWindow, limit, unit_ms, tokens)
}

/// GCRA: `requests_per_unit` per `unit_ms`, `burst` at once.
fn gcra(key: &str, burst: u64, requests_per_unit: u64, unit_ms: u64, tokens: u64) -> Hit {
    Hit::new(key, params(burst, requests_per_unit, unit_ms), tokens).using(Algorithm::Gcra)
}

fn refunding(mut hit: Hit) -> Hit {
    hit.demand.refund = true;
    hit
}

/// The same hit on a quota-mode rule.
fn quota(mut hit: Hit) -> Hit {
    hit.demand.quota = true;
    hit
}

fn shadowed(mut hit: Hit) -> Hit {
    hit.demand.shadow = true;
    hit
}

/// allowed, remaining, retry_after_ms (None = never), until_full_ms; nothing granted.
fn v(allowed: bool, remaining: u64, retry_after_ms: Option<u64>, until_full_ms: u64) -> Verdict {
    Verdict {
        allowed,
        remaining,
        retry_after_ms,
        until_full_ms,
        granted: 0,
    }
}

/// The same verdict, having taken `granted` tokens.
fn took(verdict: Verdict, granted: u64) -> Verdict {
    Verdict { granted, ..verdict }
}

/// A lease take: `tokens`, and up to `lease` more when they are taken.
fn leasing(mut hit: Hit, lease: u64) -> Hit {
    hit.demand.lease = lease;
    hit
}

/// A key of `scenario`; one hash tag per scenario keeps a request's keys in one Cluster slot.
fn key(scenario: &str, bucket: &str) -> String {
    format!("conformance:{{{scenario}}}:{bucket}")
}

/// Runs every scenario, each isolated so one failure does not hide the others.
async fn suite<B: Backend>(subject: &Subject<B>) {
    macro_rules! scenarios {
        ($($scenario:ident),* $(,)?) => {{
            let mut failures = Vec::new();
            $(
                if let Err(panic) = AssertUnwindSafe($scenario(subject)).catch_unwind().await {
                    failures.push(format!("{}: {}", stringify!($scenario), panic_text(&*panic)));
                }
            )*
            assert!(failures.is_empty(), "{} failed:\n{}", subject.name, failures.join("\n"));
        }};
    }
    scenarios!(
        full_after_idle,
        partial_refill,
        never_above_capacity,
        cost_above_tokens,
        cost_above_capacity,
        check_only,
        multi_key_atomic_rejection,
        shadow_mode,
        quota_mode,
        refund_cap,
        clock_step_back,
        u64_max_demand,
        extreme_rates,
        fixed_window_counts_and_resets,
        fixed_window_reports_reset_as_envoy,
        fixed_window_clock_step_back,
        sliding_window_weighs_the_previous_window,
        sliding_window_refunds,
        gcra_burst_then_spacing,
        gcra_fractional_interval,
        mixed_algorithms_all_or_nothing,
        lease_takes,
        byte_values_have_their_own_buckets,
        multiplied_windows_token_bucket,
        multiplied_windows_fixed_window,
        multiplied_windows_sliding_window,
        multiplied_windows_gcra,
        charges_always_land,
        slots_are_held_released_and_expire,
        a_full_cap_takes_nothing_elsewhere,
        reservations_settle,
        reservations_settle_on_gcra,
    );
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

fn options(urls: Vec<String>, mode: RedisMode) -> RedisOptions {
    RedisOptions {
        urls,
        mode,
        // Generous: these tests check semantics, not latency, on a shared CI machine.
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    }
}

async fn redis_subject(name: &'static str, opts: RedisOptions) -> Subject<RedisBackend> {
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::connect(opts)
        .await
        .unwrap_or_else(|err| panic!("{name}: connect: {err}"))
        .with_test_clock(Arc::new(clock.clone()));
    Subject {
        name,
        backend,
        clock,
    }
}

#[tokio::test]
async fn memory_conforms() {
    let clock = ManualClock::new(T0);
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default());
    suite(&Subject {
        name: "memory",
        backend,
        clock,
    })
    .await;
}

#[tokio::test]
async fn redis_standalone_conforms() {
    let server = RedisServer::start();
    let subject = redis_subject(
        "redis standalone",
        options(vec![server.url()], RedisMode::Standalone),
    )
    .await;
    suite(&subject).await;
}

#[tokio::test]
async fn redis_cluster_conforms() {
    // With replicas: writes must reach the masters (a replica would answer READONLY).
    let cluster = RedisCluster::start(3, 1);
    let subject = redis_subject("redis cluster", options(cluster.urls(), RedisMode::Cluster)).await;
    suite(&subject).await;
}
