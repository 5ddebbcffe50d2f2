//! Micro-benchmarks of the per-request path without gRPC: matching, key building, the token
//! bucket, and one whole decision on the memory backend (plus protobuf conversion).
//!
//! `cargo bench --bench hot_path` measures; under `cargo test --benches` or nextest each
//! benchmark runs once as a smoke test (criterion's test mode), so the test suite stays fast.

use std::hint::black_box;
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion, criterion_group};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::algorithm::{self, Algorithm, BucketParams, BucketState, Demand, State};
use sluice::backend::memory::{MemoryBackend, MemoryOptions};
use sluice::clock::ManualClock;
use sluice::config::{Config, load_sources};
use sluice::key::{RuleTag, write_bucket_key};
use sluice::limiter::{Limiter, LimiterOptions};
use sluice::request::{Entry, LimitRequest, RequestDescriptor};
use sluice::rls::{HeaderOptions, RequestBounds, to_limit_request, to_response};

/// A domain `bench` with `n` exact-value rules (`k=v0..`) and, when `wildcards`, as many
/// prefix wildcards (`w=p0*..`), which are tried in order.
fn config(n: usize, wildcards: bool) -> Config {
    let mut text = String::from("domain: bench\ndescriptors:\n");
    for i in 0..n {
        text.push_str(&format!(
            "  - key: k\n    value: v{i}\n    rate_limit: {{unit: day, requests_per_unit: 1, burst: 1000000000}}\n"
        ));
        if wildcards {
            text.push_str(&format!(
                "  - key: w\n    value: p{i}x*\n    rate_limit: {{unit: second, requests_per_unit: 10}}\n"
            ));
        }
    }
    text.push_str("  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 600}\n    descriptors:\n      - key: route\n        value: export\n        rate_limit: {unit: second, requests_per_unit: 5}\n");
    load_sources(&[("bench.yaml".into(), text)]).expect("generated config loads")
}

// Setup runs inside each benchmark's closure, which criterion calls only for a benchmark its
// filter selects: under nextest (one process per benchmark) nothing else is built.
fn matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("match");
    // Under the test harness (no `--bench`), smaller configs keep the smoke test quick.
    let sizes: [usize; 3] = if std::env::args().any(|a| a == "--bench") {
        [10, 1_000, 10_000]
    } else {
        [10, 100, 1_000]
    };
    for n in sizes {
        group.bench_function(BenchmarkId::new("exact", n), |b| {
            let cfg = config(n, false);
            let domain = cfg.domain("bench").unwrap();
            let entries = [Entry::new("k", format!("v{}", n / 2))];
            b.iter(|| black_box(domain.find(black_box(&entries))))
        });
    }
    for n in [10, 1_000] {
        group.bench_function(BenchmarkId::new("last_wildcard", n), |b| {
            let cfg = config(n, true);
            let domain = cfg.domain("bench").unwrap();
            // The last wildcard matches: a linear scan over all of them.
            let entries = [Entry::new("w", format!("p{}x-tail", n - 1))];
            b.iter(|| black_box(domain.find(black_box(&entries))))
        });
    }
    group.bench_function("nested_2_entries", |b| {
        let cfg = config(10, false);
        let domain = cfg.domain("bench").unwrap();
        let nested = [Entry::new("tenant", "acme"), Entry::new("route", "export")];
        b.iter(|| black_box(domain.find(black_box(&nested))))
    });
    group.finish();
}

fn key_building(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let one = [Entry::new("tenant", "acme-corp-1234")];
    let two = [
        Entry::new("tenant", "acme-corp-1234"),
        Entry::new("route", "export"),
    ];
    let escaped = [Entry::new("path", "/api/v1/items?id={42}&q=a b")];
    let long = [Entry::new("ua", "x".repeat(300))];
    for (name, entries) in [
        ("1_entry", &one[..]),
        ("2_entries", &two[..]),
        ("escaped", &escaped[..]),
        ("hashed_300B", &long[..]),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut key = String::new();
                write_bucket_key(
                    &mut key,
                    "sluice:",
                    "edge",
                    black_box(entries),
                    RuleTag::Configured,
                    Algorithm::TokenBucket,
                );
                black_box(key)
            })
        });
    }
    group.finish();
}

fn algorithm(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm");
    let params = BucketParams {
        capacity: 100,
        requests_per_unit: 600,
        unit_ms: 60_000,
    };
    // A token bucket with state (the common case: a client seen before); the others start
    // empty, which is their common case within a window.
    for algorithm in Algorithm::ALL {
        let demand = Demand::take(algorithm, params, 1);
        let state = match algorithm {
            Algorithm::TokenBucket => Some(State::TokenBucket(BucketState {
                tokens: 50.5,
                updated_ms: 1_000,
            })),
            _ => None,
        };
        for n in [1, 4] {
            let demands = vec![demand; n];
            let id = BenchmarkId::new(algorithm.as_str(), n);
            group.bench_with_input(id, &demands, |b, d| {
                b.iter(|| {
                    let mut states = vec![state; d.len()];
                    black_box(algorithm::decide(black_box(1_250), d, &mut states))
                })
            });
        }
    }
    group.finish();
}

fn pb_request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![PbEntry {
                key: "k".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// One request through everything but the network: protobuf → validated request → limiter on
/// the memory backend → protobuf response with headers.
fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    let limiter = || {
        Limiter::new(
            Arc::new(ArcSwap::from_pointee(config(10, false))),
            MemoryBackend::new(
                Arc::new(ManualClock::new(1_000_000)),
                MemoryOptions::default(),
            ),
            LimiterOptions::default(),
        )
    };
    group.bench_function("limiter_memory", |b| {
        let limiter = limiter();
        let request = LimitRequest {
            domain: "bench".into(),
            descriptors: vec![RequestDescriptor::new(vec![Entry::new("k", "v3")])],
            hits_addend: 0,
        };
        b.iter(|| {
            black_box(futures::executor::block_on(
                limiter.decide(black_box(&request)),
            ))
        })
    });
    group.bench_function("grpc_adapter_memory", |b| {
        let limiter = limiter();
        let bounds = RequestBounds::default();
        let headers = HeaderOptions::default();
        let pb = pb_request("v3");
        b.iter(|| {
            let request = to_limit_request(black_box(pb.clone()), &bounds).unwrap();
            let decision = futures::executor::block_on(limiter.decide(&request)).unwrap();
            black_box(to_response(&decision, &headers))
        })
    });
    group.finish();
}

/// One hit on the memory backend with 1 .. 1M live buckets (each populated first): the cost of
/// a lookup once the store no longer fits in cache. Under `cargo test --benches`/nextest (no
/// `--bench` argument) the largest store is 10k, so the smoke test stays quick.
fn memory_backend(c: &mut Criterion) {
    use sluice::backend::{Backend, Hit};
    let measuring = std::env::args().any(|a| a == "--bench");
    let sizes: [usize; 3] = if measuring {
        [1, 10_000, 1_000_000]
    } else {
        [1, 100, 10_000]
    };
    let params = BucketParams {
        capacity: 1_000_000_000,
        requests_per_unit: 1,
        unit_ms: 86_400_000,
    };
    let mut group = c.benchmark_group("memory_backend");
    for live in sizes {
        group.bench_function(BenchmarkId::new("live_buckets", live), |b| {
            let opts = MemoryOptions {
                max_buckets: 2_000_000,
                ..MemoryOptions::default()
            };
            let backend = MemoryBackend::new(Arc::new(ManualClock::new(1_000_000)), opts);
            let keys: Vec<String> = (0..live)
                .map(|i| format!("sluice:{{bench|k=v{i}}}"))
                .collect();
            for key in &keys {
                futures::executor::block_on(backend.check(&[Hit::new(key.as_str(), params, 1)]))
                    .unwrap();
            }
            assert_eq!(backend.live_buckets(), live);
            let mut i = 0usize;
            b.iter(|| {
                // A multiplicative stride visits the keys in a cache-unfriendly order.
                i = (i + 7_919) % keys.len();
                let hit = [Hit::new(keys[i].as_str(), params, 1)];
                black_box(futures::executor::block_on(backend.check(&hit)).unwrap())
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    matching,
    key_building,
    algorithm,
    decision,
    memory_backend
);
/// `criterion_main!`, except that criterion is told where target/ is: otherwise every process
/// (nextest starts one per benchmark) runs `cargo metadata` to find out.
fn main() {
    if std::env::var_os("CRITERION_HOME").is_none()
        && std::env::var_os("CARGO_TARGET_DIR").is_none()
    {
        // SAFETY: no other thread exists yet.
        unsafe {
            std::env::set_var(
                "CRITERION_HOME",
                concat!(env!("CARGO_MANIFEST_DIR"), "/target/criterion"),
            )
        };
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
