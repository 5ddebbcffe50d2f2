//! Differential: the Lua script against the pure algorithms. Random request sequences over keys
//! of all four algorithms get the verdicts and the stored state (to the bit) of
//! `algorithm::decide`, one call at a time and batched.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice::algorithm::{self, Algorithm, BucketParams, Demand, State};
use sluice::backend::redis::{RedisBackend, RedisMode};
use sluice::backend::{Backend, Hit};
use sluice::clock::ManualClock;
use sluice_harness as harness;
use sluice_harness::RedisServer;

use super::{T0, YEAR_MS, options, params};

const SEQUENCES: u64 = 200;
const STEPS: usize = 25;
const BASE_SEED: u64 = 0x5eed_b0c4e7;
const UNITS: [u64; 5] = [1_000, 60_000, 3_600_000, 86_400_000, YEAR_MS];

fn random_algorithm(rng: &mut impl Rng) -> Algorithm {
    Algorithm::ALL[rng.random_range(0..Algorithm::ALL.len())]
}

fn random_params(rng: &mut impl Rng, algorithm: Algorithm) -> BucketParams {
    match algorithm {
        Algorithm::TokenBucket => match rng.random_range(0..10) {
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
        },
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            let limit = match rng.random_range(0..10) {
                0 => u32::MAX.into(),
                _ => rng.random_range(1..=40),
            };
            params(limit, limit, UNITS[rng.random_range(0..UNITS.len())])
        }
        Algorithm::Gcra => match rng.random_range(0..10) {
            // A huge burst refilled once a year: arrival times far beyond 2^53 ms.
            0 => params(u32::MAX.into(), rng.random_range(1..=3), YEAR_MS),
            // Fast rates: intervals of a fraction of a millisecond.
            1 => params(
                rng.random_range(1..=100),
                rng.random_range(1_000..=100_000),
                1_000,
            ),
            _ => params(
                rng.random_range(1..=60),
                rng.random_range(1..=1_000),
                UNITS[rng.random_range(0..3)],
            ),
        },
        Algorithm::InFlight | Algorithm::Reservation => {
            unreachable!("drawn from Algorithm::ALL, the rate algorithms")
        }
    }
}

fn random_demand(rng: &mut impl Rng, algorithm: Algorithm, params: BucketParams) -> Demand {
    let limit = match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => params.requests_per_unit,
        _ => params.capacity,
    };
    let tokens = match rng.random_range(0..20) {
        0 => 0,
        1 => u64::MAX,
        2 => limit + rng.random_range(1..=3),
        _ => rng.random_range(1..=limit.min(5).max(limit / 3)),
    };
    // Lease takes for every algorithm: the windows must ignore the lease on both sides.
    let lease = match rng.random_range(0..4) {
        0 => rng.random_range(1..=limit.clamp(1, u32::MAX.into())),
        _ => 0,
    };
    // Always-charged takes (`charge: always`, never leased) put keys into debt; their counts
    // stay below 2^53, where the Lua's doubles and the Rust's integers count alike.
    let always = lease == 0 && tokens != u64::MAX && rng.random_bool(0.25);
    Demand {
        refund: rng.random_bool(0.1),
        shadow: rng.random_bool(0.2),
        quota: rng.random_bool(0.3),
        lease,
        always,
        ..Demand::take(algorithm, params, tokens)
    }
}

/// The next time: mostly forward, sometimes a long idle, sometimes backwards, sometimes onto
/// (or just before) a second or minute boundary, where windows turn over.
fn random_step(rng: &mut impl Rng, now: u64) -> u64 {
    match rng.random_range(0..12) {
        0 => now.saturating_sub(rng.random_range(0..=3_000)),
        1 => now + rng.random_range(0..=10 * YEAR_MS),
        2 => now,
        3 | 4 => {
            let unit = [1_000, 60_000][rng.random_range(0..2)];
            (now / unit + 1) * unit - rng.random_range(0..=1)
        }
        _ => now + rng.random_range(1..=2_000),
    }
}

/// A stored double, compared by its bits.
fn bits(text: &str, context: &str) -> u64 {
    text.parse::<f64>()
        .unwrap_or_else(|_| panic!("{context}: {text:?} is not a number"))
        .to_bits()
}

/// What Redis holds for `key`, checked against the model's state field by field.
fn assert_stored(inspect: &mut redis::Connection, key: &str, state: &State, context: &str) {
    let fields: &[&str] = match state {
        State::TokenBucket(_) => &["t", "u"],
        State::FixedWindow(_) => &["w", "c"],
        State::SlidingWindow(_) => &["w", "c", "p"],
        State::Gcra(_) => &["a", "f"],
        State::InFlight(_) | State::Reserved(_) => {
            unreachable!("the differential test draws rate algorithms only")
        }
    };
    let stored: Vec<String> = redis::cmd("HMGET")
        .arg(key)
        .arg(fields)
        .query(inspect)
        .unwrap_or_else(|e| panic!("{context}: HMGET {key}: {e}"));
    let integer = |text: &str| -> u64 {
        text.parse()
            .unwrap_or_else(|_| panic!("{context}: {text:?} in {key}"))
    };
    match *state {
        State::TokenBucket(s) => {
            assert_eq!(
                bits(&stored[0], context),
                s.tokens.to_bits(),
                "{context}: tokens of {key}: redis {}, model {}",
                stored[0],
                s.tokens
            );
            assert_eq!(
                integer(&stored[1]),
                s.updated_ms,
                "{context}: refill mark of {key}"
            );
        }
        State::FixedWindow(s) => {
            assert_eq!(
                (integer(&stored[0]), integer(&stored[1])),
                (s.start_ms, s.count),
                "{context}: window of {key}"
            );
        }
        State::SlidingWindow(s) => {
            assert_eq!(
                (
                    integer(&stored[0]),
                    integer(&stored[1]),
                    integer(&stored[2])
                ),
                (s.start_ms, s.current, s.previous),
                "{context}: windows of {key}"
            );
        }
        State::Gcra(s) => {
            assert_eq!(
                bits(&stored[0], context),
                s.tat_ms.to_bits(),
                "{context}: arrival time of {key}: redis {}, model {}",
                stored[0],
                s.tat_ms
            );
            assert_eq!(
                bits(&stored[1], context),
                s.tat_frac.to_bits(),
                "{context}: arrival fraction of {key}: redis {}, model {}",
                stored[1],
                s.tat_frac
            );
        }
        State::InFlight(_) | State::Reserved(_) => {}
    }
}

/// One differential sequence's buckets: 1–4 keys under `prefix`, each with a random algorithm
/// and shape, their model state (untouched) and a start time.
struct Sequence {
    keys: Vec<String>,
    algorithms: Vec<Algorithm>,
    shapes: Vec<BucketParams>,
    model: Vec<Option<State>>,
    now: u64,
}

impl Sequence {
    fn random(rng: &mut StdRng, prefix: &str) -> Self {
        let keys: Vec<String> = (0..rng.random_range(1..=4))
            .map(|bucket| format!("{prefix}:{bucket}"))
            .collect();
        let algorithms: Vec<Algorithm> = keys.iter().map(|_| random_algorithm(rng)).collect();
        let shapes = algorithms.iter().map(|&a| random_params(rng, a)).collect();
        Sequence {
            model: vec![None; keys.len()],
            now: T0 + rng.random_range(0..60_000),
            keys,
            algorithms,
            shapes,
        }
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
    let mut decided = [0usize; 4];

    for sequence in 0..SEQUENCES {
        let seed = BASE_SEED + sequence;
        let mut rng = StdRng::seed_from_u64(seed);
        let Sequence {
            keys,
            algorithms,
            shapes,
            mut model,
            mut now,
        } = Sequence::random(&mut rng, &format!("diff:{{{seed}}}"));

        for step in 0..STEPS {
            now = random_step(&mut rng, now);
            clock.set(now);
            // Every key in every step keeps each key's TTL fresh while the test clock and the
            // real clock drift apart, so expiry never decides anything here.
            let demands: Vec<Demand> = algorithms
                .iter()
                .zip(&shapes)
                .map(|(&a, &shape)| random_demand(&mut rng, a, shape))
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
            let expected = algorithm::decide(now, &demands, &mut model);
            let got = backend.check(&hits).await.expect("check");
            assert_eq!(
                got, expected,
                "seed {seed}, step {step}, now {now}: demands {demands:#?}"
            );
            for a in &algorithms {
                decided[usize::from(a.wire_code()) - 1] += 1;
            }
        }

        for (key, state) in keys.iter().zip(&model) {
            let state = state.as_ref().expect("every key was touched");
            assert_stored(&mut inspect, key, state, &format!("seed {seed}"));
        }
    }
    println!(
        "differential: decisions per algorithm (token bucket, fixed, sliding, gcra): {decided:?}"
    );
    assert!(
        decided.iter().all(|&n| n > 500),
        "every algorithm is exercised: {decided:?}"
    );
}

/// Batching: several requests decided by one script call, each as its own call would decide it
/// one after another. Random requests over random subsets of a sequence's keys (so requests of a
/// batch share keys) go out concurrently and must match `algorithm::decide` run request by
/// request in that order, and each step's batch must have been one call.
#[tokio::test]
async fn redis_batches_decide_as_requests_one_by_one() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::connect(options(vec![server.url()], RedisMode::Standalone))
        .await
        .expect("connect")
        .with_test_clock(Arc::new(clock.clone()));
    let mut inspect = server.conn();
    let mut batched = 0u64;
    let mut steps = 0u64;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut inspect)
        .expect("CONFIG RESETSTAT");

    for sequence in 0..SEQUENCES / 2 {
        let seed = BASE_SEED ^ 0xba7c4 ^ sequence;
        let mut rng = StdRng::seed_from_u64(seed);
        let Sequence {
            keys,
            algorithms,
            shapes,
            mut model,
            mut now,
        } = Sequence::random(&mut rng, &format!("batch:{{{seed}}}"));

        for step in 0..STEPS / 2 {
            now = random_step(&mut rng, now);
            clock.set(now);
            let requests = random_requests(&mut rng, keys.len());
            let mut expected = Vec::new();
            let mut batch: Vec<Vec<Hit>> = Vec::new();
            for picked in &requests {
                let demands: Vec<Demand> = picked
                    .iter()
                    .map(|&i| random_demand(&mut rng, algorithms[i], shapes[i]))
                    .collect();
                let mut states: Vec<Option<State>> = picked.iter().map(|&i| model[i]).collect();
                expected.push(algorithm::decide(now, &demands, &mut states));
                for (&i, state) in picked.iter().zip(states) {
                    model[i] = state;
                }
                batch.push(hits_of(picked, &demands, &keys));
            }
            // Polled together on this one-thread runtime, all are queued before the batch
            // worker runs, so they share one call.
            let got = futures::future::join_all(batch.iter().map(|hits| backend.check(hits))).await;
            for (request, (got, expected)) in got.into_iter().zip(&expected).enumerate() {
                assert_eq!(
                    &got.expect("check"),
                    expected,
                    "seed {seed}, step {step}, request {request} of {:?}, now {now}",
                    requests
                );
            }
            batched += requests.len() as u64;
            steps += 1;
        }

        for (key, state) in keys.iter().zip(&model) {
            let state = state.as_ref().expect("every key was touched");
            assert_stored(&mut inspect, key, state, &format!("seed {seed}"));
        }
    }
    let calls =
        harness::command_calls(&server, "evalsha") + harness::command_calls(&server, "eval");
    println!("batched differential: {batched} requests in {calls} script calls ({steps} batches)");
    assert_eq!(calls, steps, "one script call per batch");
}

/// One to eight requests, each a set of key indexes below `keys`. Every key is in the first
/// request, so every TTL stays fresh (see above); the others take random subsets.
fn random_requests(rng: &mut StdRng, keys: usize) -> Vec<Vec<usize>> {
    (0..rng.random_range(1..=8))
        .map(|request| {
            let mut picked: Vec<usize> = (0..keys)
                .filter(|_| request == 0 || rng.random_bool(0.5))
                .collect();
            if picked.is_empty() {
                picked.push(rng.random_range(0..keys));
            }
            picked
        })
        .collect()
}

/// The hits of one request: the picked keys with their demands.
fn hits_of(picked: &[usize], demands: &[Demand], keys: &[String]) -> Vec<Hit> {
    picked
        .iter()
        .zip(demands)
        .map(|(&i, demand)| Hit {
            key: keys[i].clone(),
            demand: *demand,
            rule: None,
        })
        .collect()
}
