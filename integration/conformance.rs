//! One suite of token-bucket scenarios, written once over any [`Backend`] whose clock the test
//! holds, run against every backend: memory, Redis standalone and Redis Cluster. Plus a
//! differential test: random request sequences give identical verdicts (and identical stored
//! token counts, to the bit) from the Lua script and from the pure `token_bucket::decide`.
//!
//! Each backend runs all scenarios on one server (scenarios use disjoint keys); a failing
//! scenario is reported by name and the others still run.

mod harness;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice::algorithm::{BucketParams, BucketState, Demand, Verdict, token_bucket};
use sluice::backend::memory::{MemoryBackend, MemoryOptions};
use sluice::backend::redis::{RedisBackend, RedisMode, RedisOptions};
use sluice::backend::{Backend, Hit};
use sluice::clock::ManualClock;

use harness::{RedisCluster, RedisServer};

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

    /// Checks `hits` and requires exactly `expected`.
    async fn expect(&self, hits: &[Hit], expected: &[Verdict]) {
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

/// allowed, remaining, retry_after_ms (None = never), until_full_ms.
fn v(allowed: bool, remaining: u64, retry_after_ms: Option<u64>, until_full_ms: u64) -> Verdict {
    Verdict {
        allowed,
        remaining,
        retry_after_ms,
        until_full_ms,
    }
}

/// A key of `scenario`; one hash tag per scenario keeps a request's keys in one Cluster slot.
fn key(scenario: &str, bucket: &str) -> String {
    format!("conformance:{{{scenario}}}:{bucket}")
}

// ---------------------------------------------------------------------------------------------
// Scenarios. 10 tokens at 10/s is 0.01 token/ms: one token per 100 ms, full in 1000 ms.

async fn full_after_idle<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("full_after_idle", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(100), 1_000)])
        .await;
    // Ten seconds would be 100 tokens: the bucket stops at its capacity.
    s.clock.advance(10_000);
    s.expect(&[take(&k, p, 1)], &[v(true, 9, Some(0), 100)])
        .await;
}

async fn partial_refill<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("partial_refill", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
    s.clock.advance(250); // 2.5 tokens
    s.expect(&[take(&k, p, 2)], &[v(true, 0, Some(0), 950)])
        .await;
    // 0.5 left: half a token short, 50 ms away.
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(50), 950)])
        .await;
    s.clock.advance(50);
    s.expect(&[take(&k, p, 1)], &[v(true, 0, Some(0), 1_000)])
        .await;
}

async fn never_above_capacity<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("never_above_capacity", "a"), params(5, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 1)], &[v(true, 4, Some(0), 1_000)])
        .await;
    s.clock.advance(86_400_000);
    s.expect(&[take(&k, p, 0)], &[v(true, 5, Some(0), 0)]).await;
    s.expect(&[take(&k, p, 5)], &[v(true, 0, Some(0), 5_000)])
        .await;
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(1_000), 5_000)])
        .await;
}

async fn cost_above_tokens<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("cost_above_tokens", "a"), params(10, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 8)], &[v(true, 2, Some(0), 8_000)])
        .await;
    // 5 > 2: rejected, nothing taken, 3 tokens (3 s) short.
    s.expect(&[take(&k, p, 5)], &[v(false, 2, Some(3_000), 8_000)])
        .await;
    s.expect(&[take(&k, p, 2)], &[v(true, 0, Some(0), 10_000)])
        .await;
}

async fn cost_above_capacity<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("cost_above_capacity", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 11)], &[v(false, 10, None, 0)]).await;
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
}

async fn check_only<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("check_only", "a"), params(3, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 0)], &[v(true, 3, Some(0), 0)]).await;
    s.expect(&[take(&k, p, 0)], &[v(true, 3, Some(0), 0)]).await;
    s.expect(&[take(&k, p, 3)], &[v(true, 0, Some(0), 3_000)])
        .await;
    // Check-only needs one whole token to pass.
    s.expect(&[take(&k, p, 0)], &[v(false, 0, Some(1_000), 3_000)])
        .await;
}

async fn multi_key_atomic_rejection<B: Backend>(s: &Subject<B>) {
    let (a, pa) = (key("multi_key", "a"), params(10, 1, 1_000));
    let (b, pb) = (key("multi_key", "b"), params(5, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&b, pb, 4)], &[v(true, 1, Some(0), 4_000)])
        .await;
    // `a` could pay, `b` cannot: the request is rejected and `a` keeps its tokens.
    s.expect(
        &[take(&a, pa, 3), take(&b, pb, 3)],
        &[v(true, 10, Some(0), 0), v(false, 1, Some(2_000), 4_000)],
    )
    .await;
    s.expect(
        &[take(&a, pa, 3), take(&b, pb, 1)],
        &[v(true, 7, Some(0), 3_000), v(true, 0, Some(0), 5_000)],
    )
    .await;
}

async fn shadow_mode<B: Backend>(s: &Subject<B>) {
    let (a, pa) = (key("shadow", "a"), params(10, 1, 1_000));
    let (sh, ps) = (key("shadow", "s"), params(1, 1, 1_000));
    let (sh2, ps2) = (key("shadow", "s2"), params(1, 1, 1_000));
    s.clock.set(T0);
    // A shadow bucket that cannot pay does not reject the request.
    s.expect(
        &[take(&a, pa, 2), shadow(&sh, ps, 2)],
        &[v(true, 8, Some(0), 2_000), v(false, 1, None, 0)],
    )
    .await;
    // One that can pay is charged like any other.
    s.expect(
        &[take(&a, pa, 1), shadow(&sh, ps, 1)],
        &[v(true, 7, Some(0), 3_000), v(true, 0, Some(0), 1_000)],
    )
    .await;
    // When a real bucket rejects, the shadow one is not charged either.
    s.expect(
        &[take(&a, pa, 100), shadow(&sh2, ps2, 1)],
        &[v(false, 7, None, 3_000), v(true, 1, Some(0), 0)],
    )
    .await;
}

async fn refund_cap<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("refund_cap", "a"), params(10, 1, 1_000));
    let (other, po) = (key("refund_cap", "b"), params(10, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 4)], &[v(true, 6, Some(0), 4_000)])
        .await;
    s.expect(&[refund(&k, p, 3)], &[v(true, 9, Some(0), 1_000)])
        .await;
    s.expect(&[refund(&k, p, 100)], &[v(true, 10, Some(0), 0)])
        .await;
    s.expect(&[take(&k, p, 5)], &[v(true, 5, Some(0), 5_000)])
        .await;
    // A refund is applied even when the request is rejected.
    s.expect(
        &[take(&other, po, 20), refund(&k, p, 2)],
        &[v(false, 10, None, 0), v(true, 7, Some(0), 3_000)],
    )
    .await;
}

async fn clock_step_back<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("clock_step_back", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
    // Back 5 s: no refill (elapsed clamps at 0) and the refill mark stays at T0...
    s.clock.set(T0 - 5_000);
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(100), 1_000)])
        .await;
    // ...so 100 ms after T0 there is exactly one token, not 51 ms' worth from T0 - 5 s.
    s.clock.set(T0 + 100);
    s.expect(&[take(&k, p, 1)], &[v(true, 0, Some(0), 1_000)])
        .await;
}

async fn u64_max_demand<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("u64_max", "a"), params(10, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, u64::MAX)], &[v(false, 10, None, 0)])
        .await;
    s.expect(&[take(&k, p, 5)], &[v(true, 5, Some(0), 5_000)])
        .await;
    s.expect(&[refund(&k, p, u64::MAX)], &[v(true, 10, Some(0), 0)])
        .await;
}

/// Counts beyond i64 on the wire: 2^32 - 1 tokens refilled 1 per year.
async fn extreme_rates<B: Backend>(s: &Subject<B>) {
    let (k, p) = (
        key("extreme_rates", "a"),
        params(u32::MAX.into(), 1, YEAR_MS),
    );
    s.clock.set(T0);
    // Full in 1.35e20 ms (past u64): saturates.
    s.expect(
        &[take(&k, p, u32::MAX.into())],
        &[v(true, 0, Some(0), u64::MAX)],
    )
    .await;
    // 4e8 tokens away is 1.26144e19 ms: between 2^63 and 2^64.
    s.expect(
        &[take(&k, p, 400_000_000)],
        &[v(false, 0, Some(12_614_400_000_000_000_000), u64::MAX)],
    )
    .await;
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
        refund_cap,
        clock_step_back,
        u64_max_demand,
        extreme_rates,
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

// ---------------------------------------------------------------------------------------------
// Differential: the Lua script against the pure algorithm.

const SEQUENCES: u64 = 150;
const STEPS: usize = 25;
const BASE_SEED: u64 = 0x5eed_b0c4e7;

fn random_params(rng: &mut impl Rng) -> BucketParams {
    match rng.random_range(0..10) {
        // Huge buckets with a glacial refill exercise the counts past i64 on the wire.
        0 => params(u32::MAX.into(), rng.random_range(1..=3), YEAR_MS),
        1 => params(
            rng.random_range(1..=1_000),
            rng.random_range(1..=1_000),
            1_000,
        ),
        _ => {
            let unit = [1_000, 60_000, 3_600_000][rng.random_range(0..3)];
            let per_unit = rng.random_range(1..=50);
            // A burst above or below the rate, or none.
            let capacity = match rng.random_range(0..3) {
                0 => per_unit,
                _ => rng.random_range(1..=60),
            };
            params(capacity, per_unit, unit)
        }
    }
}

fn random_demand(rng: &mut impl Rng, params: BucketParams) -> Demand {
    let tokens = match rng.random_range(0..20) {
        0 => 0,
        1 => u64::MAX,
        2 => params.capacity + rng.random_range(1..=3),
        _ => rng.random_range(1..=params.capacity.min(5).max(params.capacity / 3)),
    };
    Demand {
        params,
        tokens,
        refund: rng.random_bool(0.1),
        shadow: rng.random_bool(0.2),
    }
}

/// A time step in ms: mostly forward, sometimes a long idle, sometimes backwards.
fn random_step(rng: &mut impl Rng) -> i64 {
    match rng.random_range(0..10) {
        0 => -rng.random_range(0..=3_000),
        1 => rng.random_range(0..=(10 * YEAR_MS as i64)),
        2 => 0,
        _ => rng.random_range(1..=2_000),
    }
}

#[tokio::test]
async fn redis_script_matches_pure_algorithm() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::connect(options(vec![server.url()], RedisMode::Standalone))
        .await
        .expect("connect")
        .with_test_clock(Arc::new(clock.clone()));
    let mut inspect = server.conn();

    for sequence in 0..SEQUENCES {
        let seed = BASE_SEED + sequence;
        let mut rng = StdRng::seed_from_u64(seed);
        let keys: Vec<String> = (0..rng.random_range(1..=4))
            .map(|bucket| format!("diff:{{{seed}}}:{bucket}"))
            .collect();
        let shapes: Vec<BucketParams> = keys.iter().map(|_| random_params(&mut rng)).collect();
        let mut model: Vec<Option<BucketState>> = vec![None; keys.len()];
        let mut now = T0;

        for step in 0..STEPS {
            now = now.saturating_add_signed(random_step(&mut rng));
            clock.set(now);
            // Every key in every step keeps each key's TTL fresh while the test clock and the
            // real clock drift apart, so expiry never decides anything here.
            let demands: Vec<Demand> = shapes
                .iter()
                .map(|&shape| random_demand(&mut rng, shape))
                .collect();
            let hits: Vec<Hit> = keys
                .iter()
                .zip(&demands)
                .map(|(key, demand)| Hit {
                    key: key.clone(),
                    demand: *demand,
                    rule: None,
                })
                .collect();
            let expected = token_bucket::decide(now, &demands, &mut model);
            let got = backend.check(&hits).await.expect("check");
            assert_eq!(
                got, expected,
                "seed {seed}, step {step}, now {now}: demands {demands:#?}"
            );
        }

        for (key, state) in keys.iter().zip(&model) {
            let (tokens, updated): (String, u64) = redis::cmd("HMGET")
                .arg(key)
                .arg("t")
                .arg("u")
                .query(&mut inspect)
                .expect("HMGET");
            let state = state.expect("every key was touched");
            assert_eq!(
                tokens
                    .parse::<f64>()
                    .expect("stored tokens parse")
                    .to_bits(),
                state.tokens.to_bits(),
                "seed {seed}: stored tokens of {key}: redis {tokens}, model {}",
                state.tokens
            );
            assert_eq!(
                updated, state.updated_ms,
                "seed {seed}: refill mark of {key}"
            );
        }
    }
}
