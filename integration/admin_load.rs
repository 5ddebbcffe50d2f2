//! The admin listener cannot starve the decisions: a `sluice serve` process (memory backend)
//! with many rules and values each, RLS latency measured over gRPC with the admin listener quiet
//! and then while four clients flood every admin endpoint, alternated; and the answers stay
//! bounded (`/top`'s `n` and rules per answer are capped).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;
use sluice_harness::SluiceProcess;
use sluice_harness::rls::{desc, http_get, req};
use tonic::transport::Channel;

const RULES: usize = 200;
const VALUES: usize = 60;
/// RLS calls per measured phase, one at a time, paced.
const CALLS: usize = 400;
const ROUNDS: usize = 3;

fn config() -> String {
    let mut yaml = String::from("domain: load\ndescriptors:\n");
    for rule in 0..RULES {
        yaml.push_str(&format!(
            "  - key: r{rule}\n    rate_limit: {{unit: second, requests_per_unit: 5}}\n"
        ));
    }
    yaml
}

/// A value long enough that labels are near their 160-byte cut.
fn value(n: usize) -> String {
    format!("tenant-{n:04}-{}", "x".repeat(120))
}

/// Every rule × value once, 16 calls at a time: every summary full.
async fn fill(client: &RateLimitServiceClient<Channel>) {
    let mut calls = tokio::task::JoinSet::new();
    for lane in 0..16 {
        let mut client = client.clone();
        calls.spawn(async move {
            for i in (lane..RULES * VALUES).step_by(16) {
                let (rule, v) = (format!("r{}", i % RULES), value(i / RULES));
                let request = req("load", vec![desc(&[(&rule, &v)])]);
                client.should_rate_limit(request).await.expect("decided");
            }
        });
    }
    while calls.join_next().await.is_some() {}
}

/// `CALLS` calls, one every 2 ms: each latency.
#[allow(clippy::disallowed_methods)] // latency on this machine's clock
async fn measure(client: &mut RateLimitServiceClient<Channel>) -> Vec<Duration> {
    let mut took = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let request = req(
            "load",
            vec![desc(&[(&format!("r{}", i % RULES), &value(i))])],
        );
        let start = Instant::now();
        client.should_rate_limit(request).await.expect("decided");
        took.push(start.elapsed());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    took.sort();
    took
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// Every admin endpoint, the heaviest asks first.
fn endpoints() -> Vec<String> {
    let d = format!("r7={}", value(3));
    vec![
        "/top?n=100&limit=50".into(),
        "/metrics".into(),
        "/top?n=100&limit=50&offset=50".into(),
        "/config".into(),
        format!("/explain?domain=load&descriptor={d}"),
        format!("/buckets?domain=load&descriptor={d}"),
        "/status".into(),
        "/".into(),
        "/healthz".into(),
        "/readyz".into(),
    ]
}

/// Four threads asking every admin endpoint in turn until `stop`; counts answers and the largest.
struct Flood {
    stop: Arc<AtomicBool>,
    answers: Arc<AtomicU64>,
    largest: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(admin: SocketAddr) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(AtomicU64::new(0));
        let largest = Arc::new(AtomicU64::new(0));
        let threads = (0..4)
            .map(|_| {
                let (stop, answers, largest) = (stop.clone(), answers.clone(), largest.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        for path in endpoints() {
                            let (status, body) = http_get(admin, &path);
                            assert_eq!(status, 200, "GET {path}: {body}");
                            answers.fetch_add(1, Ordering::Relaxed);
                            largest.fetch_max(body.len() as u64, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Flood {
            stop,
            answers,
            largest,
            threads,
        }
    }

    /// Stops the clients: (answers, largest answer in bytes).
    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("flood client");
        }
        (
            self.answers.load(Ordering::Relaxed),
            self.largest.load(Ordering::Relaxed),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_every_admin_endpoint_leaves_rls_latency_as_it_was() {
    let sluice = SluiceProcess::start(&[("load.yaml", &config())], &[]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", sluice.grpc))
        .await
        .expect("RLS client connects");
    fill(&client).await;
    let (status, top) = http_get(sluice.admin, "/top?n=100&limit=50");
    assert_eq!(status, 200, "{top}");
    let top: Value = serde_json::from_str(&top).unwrap();
    assert_eq!(top["rules_total"], RULES, "every rule is tracked");
    assert_eq!(top["rules"].as_array().unwrap().len(), 50);
    assert_eq!(top["next_offset"], 50);
    assert_eq!(
        http_get(sluice.admin, "/top?n=100000").0,
        400,
        "n is capped"
    );
    assert_eq!(http_get(sluice.admin, "/top?limit=51").0, 400, "rules too");

    let (mut quiet, mut flooded) = (Vec::new(), Vec::new());
    let (mut answers, mut largest) = (0, 0);
    for round in 0..ROUNDS {
        let q = measure(&mut client).await;
        let flood = Flood::start(sluice.admin);
        let f = measure(&mut client).await;
        let (n, big) = flood.stop();
        println!(
            "round {round}: quiet p50 {:?} p99 {:?}; flooded p50 {:?} p99 {:?} ({n} admin answers)",
            quantile(&q, 0.5),
            quantile(&q, 0.99),
            quantile(&f, 0.5),
            quantile(&f, 0.99),
        );
        quiet.push(quantile(&q, 0.99));
        flooded.push(quantile(&f, 0.99));
        answers += n;
        largest = largest.max(big);
    }
    let (quiet, flooded) = (median(quiet), median(flooded));
    println!(
        "median p99: quiet {quiet:?}, flooded {flooded:?}; {answers} admin answers, largest {largest} bytes"
    );
    assert!(answers >= 30, "the flood was a flood: {answers} answers");
    assert!(
        largest < 3 << 20,
        "every answer is bounded: {largest} bytes"
    );
    // Envoy's 20 ms deadline, and within noise of the quiet figure (a generous margin: two cores
    // shared with other work).
    assert!(
        flooded < Duration::from_millis(20),
        "RLS p99 under the admin flood {flooded:?} (quiet {quiet:?})"
    );
    assert!(
        flooded <= quiet * 3 + Duration::from_millis(3),
        "RLS p99 under the admin flood {flooded:?} against {quiet:?} quiet"
    );
}
