//! The soak's load: workers calling the replicas round robin with keys drawn Zipf, and what
//! each call is remembered by ([`Sample`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_harness::rls::{OK, OVER_LIMIT, desc, header};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::{HUNG, PACE, RULES, WORKERS, now};

/// Zipf over `0..n` (0 the most frequent) by inverse CDF.
pub(super) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub(super) fn new(n: usize, exponent: f64) -> Zipf {
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|rank| {
                total += (rank as f64).powf(-exponent);
                total
            })
            .collect();
        for p in &mut cdf {
            *p /= total;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut impl Rng) -> u32 {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&p| p < u).min(self.cdf.len() - 1) as u32
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Ok,
    OverLimit,
    /// A gRPC error or a hung call.
    Failed,
}

/// No second rule in [`Sample::rules`].
const NO_RULE: u8 = u8::MAX;

/// One call, kept small: a long soak holds millions.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    /// ms since the soak started.
    pub(super) sent: u32,
    pub(super) replied: u32,
    pub(super) value: u32,
    /// Indexes into [`RULES`]; the second may be [`NO_RULE`].
    pub(super) rules: [u8; 2],
    pub(super) outcome: Outcome,
    pub(super) degraded: bool,
}

impl Sample {
    pub(super) fn rules(&self) -> impl Iterator<Item = usize> {
        self.rules
            .into_iter()
            .filter(|r| *r != NO_RULE)
            .map(usize::from)
    }

    /// Admitted on Redis's word (not by a failure policy).
    pub(super) fn admitted_by_redis(&self) -> bool {
        self.outcome == Outcome::Ok && !self.degraded
    }
}

fn request(rules: [u8; 2], value: u32) -> RateLimitRequest {
    let value = format!("k{value}");
    let descriptors: Vec<RateLimitDescriptor> = rules
        .into_iter()
        .filter(|r| *r != NO_RULE)
        .map(|r| desc(&[(RULES[usize::from(r)].key, &value)]))
        .collect();
    RateLimitRequest {
        domain: "soak".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// A worker's samples, and the errors it kept.
type Collected = (Vec<Sample>, Vec<CallError>);

/// A failed call's send and reply times (ms) and what it failed with.
pub(super) type CallError = (u32, u32, String);

/// One worker of the load: calls the replicas round robin, paced, until stopped.
struct Worker {
    clients: Vec<RateLimitServiceClient<Channel>>,
    zipf: Arc<Zipf>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    start: Instant,
}

impl Worker {
    async fn run(self, worker: usize, mut rng: StdRng) -> Collected {
        let mut samples = Vec::new();
        let mut errors = Vec::new();
        let mut n = worker;
        let ms = |at: Instant| (at - self.start).as_millis() as u32;
        while !self.stop.load(Ordering::Relaxed) {
            let value = self.zipf.sample(&mut rng);
            let rules = pick_rules(&mut rng);
            let mut client = self.clients[n % self.clients.len()].clone();
            n += 1;
            let sent_at = now();
            let reply =
                tokio::time::timeout(HUNG, client.should_rate_limit(request(rules, value))).await;
            let replied_at = now();
            let (outcome, degraded) = match judge(reply) {
                Ok(answer) => answer,
                Err(message) => {
                    if errors.len() < 1_000 {
                        errors.push((ms(sent_at), ms(replied_at), message));
                    }
                    (Outcome::Failed, false)
                }
            };
            samples.push(Sample {
                sent: ms(sent_at),
                replied: ms(replied_at),
                value,
                rules,
                outcome,
                degraded,
            });
            self.sent.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(PACE).await;
        }
        (samples, errors)
    }
}

/// A random rule, and for a quarter of the calls a second rule for the same value.
fn pick_rules(rng: &mut StdRng) -> [u8; 2] {
    let first = rng.random_range(0..RULES.len());
    let second = if rng.random_ratio(1, 4) {
        ((first + rng.random_range(1..RULES.len())) % RULES.len()) as u8
    } else {
        NO_RULE
    };
    [first as u8, second]
}

/// A reply's outcome and whether it was degraded, or why the call failed.
fn judge(
    reply: Result<
        Result<tonic::Response<RateLimitResponse>, tonic::Status>,
        tokio::time::error::Elapsed,
    >,
) -> Result<(Outcome, bool), String> {
    match reply {
        Ok(Ok(r)) => {
            let r = r.into_inner();
            let degraded = header(&r, "x-ratelimit-degraded").is_some();
            match r.overall_code {
                OK => Ok((Outcome::Ok, degraded)),
                OVER_LIMIT => Ok((Outcome::OverLimit, degraded)),
                code => Err(format!("overall code {code}")),
            }
        }
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {HUNG:?}")),
    }
}

/// The load: workers calling the replicas round robin until stopped.
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    workers: Vec<JoinHandle<Collected>>,
}

impl Load {
    pub(super) fn start(
        clients: Vec<RateLimitServiceClient<Channel>>,
        zipf: Arc<Zipf>,
        start: Instant,
        seed: u64,
    ) -> Load {
        let stop: Arc<AtomicBool> = Arc::default();
        let sent: Arc<AtomicU64> = Arc::default();
        let workers = (0..WORKERS)
            .map(|worker| {
                let shared = Worker {
                    clients: clients.clone(),
                    zipf: zipf.clone(),
                    stop: stop.clone(),
                    sent: sent.clone(),
                    start,
                };
                let rng = StdRng::seed_from_u64(seed.wrapping_add(worker as u64));
                tokio::spawn(shared.run(worker, rng))
            })
            .collect();
        Load {
            stop,
            sent,
            workers,
        }
    }

    pub(super) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Every sample, by send time, and every error message kept (with its send time).
    pub(super) async fn finish(self) -> Collected {
        self.stop.store(true, Ordering::Relaxed);
        let (mut samples, mut errors) = (Vec::new(), Vec::new());
        for worker in self.workers {
            let (s, e) = worker.await.expect("load worker");
            samples.extend(s);
            errors.extend(e);
        }
        samples.sort_by_key(|s| s.sent);
        errors.sort_by_key(|e| e.0);
        (samples, errors)
    }
}
