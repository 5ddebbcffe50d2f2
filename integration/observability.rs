//! Metrics and logs through the real paths: requests over gRPC, counters scraped from the admin
//! listener's `GET /metrics`, memory and Redis backends, reloads, and the real binary's logs.
//! Also: every metric the Grafana dashboard and the alert rules use is in a real scrape.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::settings::BackendKind;
use sluice_harness::rls::{OK, OVER_LIMIT, desc, http_get, req};
use sluice_harness::sluice::TestServer;
use sluice_harness::{RedisServer, SluiceBuilder, command_calls, wait_until};

/// One scrape: (sample name, labels) → value, and the families of `# TYPE` lines.
#[derive(Debug, Default)]
struct Scrape(
    BTreeMap<(String, BTreeMap<String, String>), f64>,
    BTreeSet<String>,
);

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut out = BTreeMap::new();
        let families = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
                None => (series, BTreeMap::new()),
            };
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("value in {line}")),
            };
            out.insert((name.to_string(), labels), value);
        }
        Scrape(out, families)
    }

    /// The value of the one series of `name` whose labels include `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<f64> = self
            .0
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "{name} {labels:?}: expected one series, found {matching:?}"
        );
        matching[0]
    }

    fn has(&self, name: &str) -> bool {
        self.0.keys().any(|(n, _)| n == name)
    }

    /// Sample names (`x_bucket`, `x_count`, …) and family names (`x`).
    fn names(&self) -> BTreeSet<String> {
        let samples = self.0.keys().map(|(n, _)| n.clone());
        samples.chain(self.1.iter().cloned()).collect()
    }

    /// Values of `name` per `key` label (the per-rule counters).
    fn by_key(&self, name: &str, domain: &str) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter(|((n, l), _)| n == name && l.get("domain").map(String::as_str) == Some(domain))
            .map(|((_, l), v)| (l["key"].clone(), *v))
            .collect()
    }
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_string(), value);
        rest = &after[end..];
    }
    labels
}

/// `GET /metrics` (a blocking HTTP/1.0 call: the tests run on a multi-threaded runtime, so the
/// admin listener keeps being served meanwhile).
fn scrape(admin: SocketAddr) -> Scrape {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "{body}");
    Scrape::parse(&body)
}

fn hits(mut request: RateLimitRequest, hits_addend: u32) -> RateLimitRequest {
    request.hits_addend = hits_addend;
    request
}

const OBS: &str = "\
domain: obs
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    value: export
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_rule_counters_are_exact_after_traffic_and_survive_a_reload() {
    let mut s = TestServer::start_with(&[("obs.yaml", OBS)], |settings| {
        settings.telemetry.metrics_detailed_max_values = 1;
        settings.config_ops.watch_debounce = Duration::from_millis(20);
    })
    .await;
    let codes = send_obs_traffic(&mut s).await;
    let invalid = s.call(req("", vec![desc(&[("tenant", "acme")])])).await;
    assert_eq!(invalid.unwrap_err().code(), tonic::Code::InvalidArgument);
    assert_eq!(codes.iter().filter(|c| **c == OVER_LIMIT).count(), 3);
    assert_eq!(codes.iter().filter(|c| **c == OK).count(), 21);

    let m = scrape(s.admin_addr());
    assert_obs_per_rule_counters(&m);
    assert_obs_request_counters(&m);
    let first_digest = config_digest(&m);

    // A rejected edit: counted, flagged, the old config (and its counters) stay.
    let file = s.dir.path().join("obs.yaml");
    std::fs::write(
        &file,
        OBS.replace("requests_per_unit: 10", "requests_per_unit: -1"),
    )
    .unwrap();
    let admin = s.admin_addr();
    let m = poll_scrape(admin, |m| {
        m.get("ratelimit_service_config_load_error", &[]) == 1.0
    })
    .await;
    assert_eq!(m.get("sluice_config_last_load_failed", &[]), 1.0);
    assert_eq!(config_digest(&m), first_digest);

    // A good edit of the tenant limit: its counters go on from where they were.
    std::fs::write(
        &file,
        OBS.replace("requests_per_unit: 10", "requests_per_unit: 50"),
    )
    .unwrap();
    let m = poll_scrape(admin, |m| {
        m.get("ratelimit_service_config_load_success", &[]) == 2.0
    })
    .await;
    assert_eq!(m.get("sluice_config_last_load_failed", &[]), 0.0);
    assert_ne!(config_digest(&m), first_digest);
    s.ok(req("obs", vec![desc(&[("tenant", "gamma")])])).await;
    let m = scrape(admin);
    assert_eq!(
        m.get(
            "ratelimit_service_rate_limit_total_hits",
            &[("domain", "obs"), ("key", "tenant")]
        ),
        24.0
    );
    s.stop().await;
}

/// The traffic of `per_rule_counters_are_exact_after_traffic_and_survive_a_reload` over `OBS`,
/// request by request; the overall code of each.
async fn send_obs_traffic(s: &mut TestServer) -> Vec<i32> {
    let mut codes = Vec::new();
    // tenant=acme, capacity 10: ten allowed (the 9th and 10th past 80 %), two over.
    for _ in 0..12 {
        codes.push(
            s.ok(req("obs", vec![desc(&[("tenant", "acme")])]))
                .await
                .overall_code,
        );
    }
    // tenant=beta: nine hits at once (used 9 > 8: one of them near), one more (near), one over.
    for n in [9, 1, 1] {
        codes.push(
            s.ok(hits(req("obs", vec![desc(&[("tenant", "beta")])]), n))
                .await
                .overall_code,
        );
    }
    // Shadow rule of capacity 2: the third hit is over limit, answered OK.
    for _ in 0..3 {
        codes.push(
            s.ok(req("obs", vec![desc(&[("route", "export")])]))
                .await
                .overall_code,
        );
    }
    // detailed_metric with room for one value: alice gets her series, bob lands in the rule's.
    for user in ["alice", "alice", "bob"] {
        codes.push(
            s.ok(req("obs", vec![desc(&[("user", user)])]))
                .await
                .overall_code,
        );
    }
    // Unlimited, unknown domain: counted nowhere per rule.
    codes.push(
        s.ok(req("obs", vec![desc(&[("free", "x")])]))
            .await
            .overall_code,
    );
    for _ in 0..2 {
        codes.push(
            s.ok(req("nowhere", vec![desc(&[("tenant", "acme")])]))
                .await
                .overall_code,
        );
    }
    codes
}

/// The per-rule counters of domain `obs` after `send_obs_traffic`.
fn assert_obs_per_rule_counters(m: &Scrape) {
    let rule = |name: &str| m.by_key(name, "obs");
    let expect = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    assert_eq!(
        rule("ratelimit_service_rate_limit_total_hits"),
        expect(&[
            ("tenant", 23.0),
            ("route_export", 3.0),
            ("user", 1.0),
            ("user_alice", 2.0),
            ("free", 0.0)
        ])
    );
    assert_eq!(
        rule("ratelimit_service_rate_limit_within_limit"),
        expect(&[
            ("tenant", 20.0),
            ("route_export", 2.0),
            ("user", 1.0),
            ("user_alice", 2.0),
            ("free", 0.0)
        ])
    );
    assert_eq!(
        rule("ratelimit_service_rate_limit_over_limit"),
        expect(&[
            ("tenant", 3.0),
            ("route_export", 1.0),
            ("user", 0.0),
            ("user_alice", 0.0),
            ("free", 0.0)
        ])
    );
    assert_eq!(
        rule("ratelimit_service_rate_limit_near_limit"),
        expect(&[
            ("tenant", 4.0),
            ("route_export", 1.0),
            ("user", 0.0),
            ("user_alice", 0.0),
            ("free", 0.0)
        ])
    );
    assert_eq!(
        rule("ratelimit_service_rate_limit_shadow_mode"),
        expect(&[
            ("tenant", 0.0),
            ("route_export", 1.0),
            ("user", 0.0),
            ("user_alice", 0.0),
            ("free", 0.0)
        ])
    );
    assert!(
        rule("ratelimit_service_rate_limit_over_limit_with_local_cache")
            .values()
            .all(|v| *v == 0.0)
    );
}

/// The service-wide counters after `send_obs_traffic` and one invalid request: requests by
/// outcome, errors, unknown domains, response times, buckets, config loads.
fn assert_obs_request_counters(m: &Scrape) {
    let requests = |outcome: &str| {
        m.get(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit"), ("outcome", outcome)],
        )
    };
    assert_eq!(requests("ok"), 21.0);
    assert_eq!(requests("over_limit"), 3.0);
    assert_eq!(requests("invalid_argument"), 1.0);
    assert_eq!(requests("unavailable"), 0.0);
    assert_eq!(
        m.get(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "service_error")]
        ),
        1.0
    );
    assert_eq!(m.get("sluice_unknown_domain_total", &[]), 2.0);
    assert_eq!(
        m.get(
            "ratelimit_service_response_time_seconds_count",
            &[("grpc_method", "ShouldRateLimit")]
        ),
        25.0
    );
    // acme, beta, route=export, alice, bob: buckets no longer full.
    assert_eq!(m.get("sluice_memory_buckets", &[]), 5.0);
    assert_eq!(m.get("ratelimit_service_config_load_success", &[]), 1.0);
    assert_eq!(m.get("ratelimit_service_config_load_error", &[]), 0.0);
    assert!(
        !m.has("sluice_redis_errors_total"),
        "no Redis, no Redis metrics"
    );
}

/// The `digest` label of `sluice_config_info`.
fn config_digest(m: &Scrape) -> String {
    m.0.keys()
        .find(|(n, _)| n == "sluice_config_info")
        .map(|(_, l)| l["digest"].clone())
        .expect("config info")
}

async fn poll_scrape(admin: SocketAddr, done: impl Fn(&Scrape) -> bool) -> Scrape {
    for _ in 0..500 {
        let m = scrape(admin);
        if done(&m) {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "metrics never reached the expected state: {:?}",
        scrape(admin)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_off_removes_the_endpoint_and_nothing_else() {
    let mut s = TestServer::start_with(&[("obs.yaml", OBS)], |settings| {
        settings.telemetry.metrics = false;
    })
    .await;
    let r = s.ok(req("obs", vec![desc(&[("tenant", "acme")])])).await;
    assert_eq!(r.overall_code, OK);
    let (status, body) = http_get(s.admin_addr(), "/metrics");
    assert_eq!(status, 404);
    assert!(body.contains("--metrics false"), "{body}");
    s.stop().await;
}

const REDIS_CONFIG: &[(&str, &str)] = &[
    (
        "open.yaml",
        "domain: open\nfailure_mode: open\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    ),
    (
        "strict.yaml",
        "domain: strict\nfailure_mode: error\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    ),
];

async fn redis_server(redis: &RedisServer) -> TestServer {
    let url = redis.url();
    TestServer::start_with(REDIS_CONFIG, move |settings| {
        settings.backend = BackendKind::Redis;
        settings.redis_url = vec![url];
        settings.key_prefix = "obs:".into();
    })
    .await
}

/// `sluice_redis_batch_requests` counts every batched script call and the requests it decided:
/// its count is Redis's own count of script calls and its sum the requests (the probe's check
/// is one), however they batched. Redis is stopped while 50 checks arrive, so the first two calls (`--redis-batch-calls`)
/// hang and the other 48 queue: once it resumes they go in one more call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_sizes_count_every_script_call_and_its_requests() {
    let redis = RedisServer::start();
    let url = redis.url();
    let s = TestServer::start_with(REDIS_CONFIG, move |settings| {
        settings.backend = BackendKind::Redis;
        settings.redis_url = vec![url];
        settings.redis_timeout = Duration::from_secs(5);
    })
    .await;
    let script_calls = || command_calls(&redis, "evalsha") + command_calls(&redis, "eval");
    let batches = |m: &Scrape| {
        (
            m.get("sluice_redis_batch_requests_count", &[]),
            m.get("sluice_redis_batch_requests_sum", &[]),
        )
    };
    // An answer keeps the health loop from probing Redis for the next 500 ms (it probes only
    // when nothing was answered for that long), longer than the burst below takes.
    let mut client = s.client.clone();
    let warm_up = req("open", vec![desc(&[("client", "warm-up")])]);
    client.should_rate_limit(warm_up).await.expect("warm-up");
    let (calls_before, requests_before) = batches(&scrape(s.admin_addr()));
    let redis_before = script_calls();

    redis.pause();
    let checks: Vec<_> = (0..50)
        .map(|n| {
            let mut client = s.client.clone();
            tokio::spawn(async move {
                let request = req("open", vec![desc(&[("client", &format!("c{n}"))])]);
                client.should_rate_limit(request).await
            })
        })
        .collect();
    let admin = s.admin_addr();
    wait_until("the checks queued", Duration::from_secs(5), || {
        batches(&scrape(admin)).0 - calls_before >= 2.0
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    redis.resume();
    for check in checks {
        let answer = check.await.expect("task").expect("answered by Redis");
        assert_eq!(answer.into_inner().overall_code, OK);
    }

    let (calls, requests) = batches(&scrape(s.admin_addr()));
    assert_eq!(requests - requests_before, 50.0);
    assert_eq!(calls - calls_before, (script_calls() - redis_before) as f64);
    assert_eq!(
        calls - calls_before,
        3.0,
        "two hung calls, then the queue in one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_errors_and_degraded_decisions_are_counted() {
    let redis = RedisServer::start();
    let mut s = redis_server(&redis).await;
    let client = |c: &str| vec![desc(&[("client", c)])];
    for _ in 0..4 {
        s.ok(req("open", client("a"))).await;
    }
    let m = scrape(s.admin_addr());
    assert_eq!(m.get("sluice_redis_call_duration_seconds_count", &[]), 4.0);
    // One after another, each call decides one request (the readiness probe's calls included:
    // the histogram counts every batched script call).
    let calls = m.get("sluice_redis_batch_requests_count", &[]);
    assert!(calls >= 4.0, "{calls}");
    assert_eq!(m.get("sluice_redis_batch_requests_sum", &[]), calls);
    assert_eq!(m.get("sluice_redis_timeout_seconds", &[]), 0.015);
    assert_eq!(
        m.get("sluice_redis_errors_total", &[("kind", "timeout")]),
        0.0
    );
    assert_eq!(
        m.get(
            "ratelimit_service_rate_limit_over_limit",
            &[("domain", "open"), ("key", "client")]
        ),
        1.0
    );
    assert!(!m.has("sluice_memory_buckets"));

    // A stalled Redis: every call runs into the 15 ms deadline. `open` answers OK by policy,
    // `strict` fails the call.
    redis.pause();
    for _ in 0..3 {
        let r = s.ok(req("open", client("b"))).await;
        assert_eq!(r.overall_code, OK);
    }
    let strict = s.call(req("strict", client("b"))).await;
    assert_eq!(strict.unwrap_err().code(), tonic::Code::Unavailable);
    redis.resume();

    assert_stalled_redis_counted(&scrape(s.admin_addr()));
    s.stop().await;
}

/// After `redis_calls_errors_and_degraded_decisions_are_counted`'s stall: four timed-out calls,
/// three degraded `open` decisions, one failed `strict` call, and the rule's hits.
fn assert_stalled_redis_counted(m: &Scrape) {
    assert_eq!(m.get("sluice_redis_call_duration_seconds_count", &[]), 8.0);
    assert_eq!(
        m.get("sluice_redis_errors_total", &[("kind", "timeout")]),
        4.0
    );
    assert_eq!(
        m.get("sluice_redis_errors_total", &[("kind", "unavailable")]),
        0.0
    );
    assert_eq!(
        m.get(
            "sluice_degraded_decisions_total",
            &[("domain", "open"), ("policy", "open")]
        ),
        3.0
    );
    assert_eq!(
        m.get(
            "sluice_degraded_decisions_total",
            &[("domain", "strict"), ("policy", "open")]
        ),
        0.0
    );
    let rule = |name: &str| m.get(name, &[("domain", "open"), ("key", "client")]);
    // Degraded hits count as hits, not as within or over: no bucket was asked.
    assert_eq!(rule("ratelimit_service_rate_limit_total_hits"), 7.0);
    assert_eq!(rule("ratelimit_service_rate_limit_within_limit"), 3.0);
    assert_eq!(rule("ratelimit_service_rate_limit_over_limit"), 1.0);
    assert_eq!(
        m.get(
            "ratelimit_service_total_requests",
            &[("outcome", "unavailable")]
        ),
        1.0
    );
    assert_eq!(
        m.get(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "redis_error")]
        ),
        1.0
    );
}

/// The resilience layer's own figures through the real path: rejections answered from the
/// over-limit cache (no Redis call), and the breaker gauge following a stalled Redis open and
/// closed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cache_rejections_and_breaker_states_are_exported() {
    let redis = RedisServer::start();
    let mut s = redis_server(&redis).await;
    let endpoint = redis.addr();
    let client = |c: &str| vec![desc(&[("client", c)])];
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(s.ok(req("open", client("cached"))).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OK, OVER_LIMIT, OVER_LIMIT, OVER_LIMIT]);
    let m = scrape(s.admin_addr());
    let rule = |m: &Scrape, name: &str| m.get(name, &[("domain", "open"), ("key", "client")]);
    assert_eq!(rule(&m, "ratelimit_service_rate_limit_total_hits"), 6.0);
    assert_eq!(rule(&m, "ratelimit_service_rate_limit_within_limit"), 3.0);
    assert_eq!(rule(&m, "ratelimit_service_rate_limit_over_limit"), 3.0);
    assert_eq!(
        rule(
            &m,
            "ratelimit_service_rate_limit_over_limit_with_local_cache"
        ),
        2.0,
        "the first rejection comes from Redis, the next two from the cache"
    );
    assert_eq!(
        m.get("sluice_redis_call_duration_seconds_count", &[]),
        4.0,
        "cached rejections cost no Redis call"
    );
    let state = |m: &Scrape, state: &str| {
        m.get(
            "sluice_redis_breaker_state",
            &[("endpoint", endpoint.as_str()), ("state", state)],
        )
    };
    assert_eq!((state(&m, "closed"), state(&m, "open")), (1.0, 0.0));

    // A stalled Redis: one call after another, each timing out in a moment of its own (a
    // deadline apart); after --breaker-failures (10) failed moments, at least half of the
    // window's, the breaker opens and calls are skipped (policy `open` answers) instead of
    // waiting out the deadline.
    redis.pause();
    for i in 0..14 {
        let r = s.ok(req("open", client(&format!("stalled-{i}")))).await;
        assert_eq!(r.overall_code, OK);
    }
    let m = scrape(s.admin_addr());
    assert_eq!((state(&m, "closed"), state(&m, "open")), (0.0, 1.0));
    let timeouts = m.get("sluice_redis_errors_total", &[("kind", "timeout")]);
    assert!(
        timeouts <= 10.0,
        "once open, the breaker skips Redis: {timeouts} timeouts of 14 calls"
    );
    assert_eq!(
        m.get(
            "sluice_degraded_decisions_total",
            &[("domain", "open"), ("policy", "open")]
        ),
        14.0
    );
    redis.resume();
    // The health probe is the half-open call that closes it again, traffic or not.
    poll_scrape(s.admin_addr(), |m| state(m, "closed") == 1.0).await;
    s.stop().await;
}

/// Metric names (`ratelimit_*`, `sluice_*`) mentioned anywhere in `text`.
fn metric_names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for prefix in ["ratelimit_", "sluice_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix).map(|i| from + i) {
            let boundary =
                at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            let end = text[at..]
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .map_or(text.len(), |i| at + i);
            if boundary {
                names.insert(text[at..end].to_string());
            }
            from = end.max(at + 1);
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_use_is_in_a_real_scrape() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dashboard = std::fs::read_to_string(format!(
        "{root}/deploy/observability/grafana-dashboard.json"
    ))
    .unwrap();
    let alerts =
        std::fs::read_to_string(format!("{root}/deploy/observability/alerts.yaml")).unwrap();
    let used: BTreeSet<String> = metric_names_in(&dashboard)
        .into_iter()
        .chain(metric_names_in(&alerts))
        .collect();
    assert!(used.len() >= 10, "{used:?}");

    // Every family a deployment can show: the memory backend's and the Redis backend's (with its
    // breaker), with traffic (histograms appear with their first sample).
    let mut memory = TestServer::start(&[("obs.yaml", OBS)]).await;
    memory
        .ok(req("obs", vec![desc(&[("tenant", "acme")])]))
        .await;
    let redis = RedisServer::start();
    let mut shared = redis_server(&redis).await;
    shared.ok(req("open", vec![desc(&[("client", "a")])])).await;
    let mut exported = scrape(memory.admin_addr()).names();
    let redis_scrape = scrape(shared.admin_addr());
    assert_eq!(
        redis_scrape.get(
            "sluice_redis_breaker_state",
            &[("endpoint", &redis.addr()), ("state", "closed")]
        ),
        1.0
    );
    assert_eq!(
        redis_scrape.get(
            "sluice_redis_breaker_state",
            &[("endpoint", &redis.addr()), ("state", "open")]
        ),
        0.0
    );
    exported.extend(redis_scrape.names());
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard or the alerts use metrics no scrape has: {missing:?}\nexported: {exported:?}"
    );
    memory.stop().await;
    shared.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_json_lines_and_takes_the_near_limit_ratio_from_envoyproxys_variable() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("obs.yaml");
    std::fs::write(&file, OBS).unwrap();
    let mut sluice = SluiceBuilder::config(dir.path())
        .args(["--log-format", "json", "--watch-debounce", "20ms"])
        .args(["--drain-timeout", "200ms"])
        .env("NEAR_LIMIT_RATIO", "0.5")
        .start();
    let admin = sluice.admin;
    let mut client = sluice.client().await;
    for _ in 0..20 {
        client
            .should_rate_limit(req("obs", vec![desc(&[("tenant", "acme")])]))
            .await
            .unwrap();
    }
    // Capacity 10 at ratio 0.5: the 6th to 10th hits are near limit (0.8 would make it 2).
    let m = scrape(admin);
    let near = |m: &Scrape| {
        m.get(
            "ratelimit_service_rate_limit_near_limit",
            &[("domain", "obs"), ("key", "tenant")],
        )
    };
    assert_eq!(near(&m), 5.0);
    // Two errors in one rejected set: one line.
    std::fs::write(
        &file,
        OBS.replace("requests_per_unit: 10", "requests_per_unit: -1")
            .replace(
                "unit: hour, requests_per_unit: 2",
                "unit: fortnight, requests_per_unit: 2",
            ),
    )
    .unwrap();
    wait_until("the rejection", Duration::from_secs(20), || {
        let (_, body) = http_get(admin, "/metrics");
        body.contains("ratelimit_service_config_load_error 1")
    });
    // An open connection would hold the drain for its full timeout.
    drop(client);
    sluice.terminate(Duration::from_secs(30));
    let stderr = sluice.log();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let rejected: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("config rejected"))
        })
        .collect();
    assert_eq!(rejected.len(), 1, "{stderr}");
    assert_eq!(rejected[0]["level"], "ERROR");
    let errors = rejected[0]["fields"]["errors"].as_str().unwrap();
    assert!(
        errors.contains("obs.yaml:4:") && errors.contains("fortnight"),
        "{errors}"
    );
    assert_eq!(rejected[0]["fields"]["count"], 2);
    // 20 requests, and nothing about any of them at info.
    assert!(lines.len() < 10, "{stderr}");
    assert!(!stderr.contains("acme"), "{stderr}");
}
