//! Every algorithm end to end: Envoy's own RLS client in, `RateLimitResponse` (statuses and
//! headers) out, through the real server on the memory backend, on Redis standalone and on
//! Redis Cluster. Time is real here (the memory backend's clock, Redis `TIME`), so windows are
//! long (a day; a scenario does not start in the last minute of one) and the checks of reported
//! times allow for the seconds a test takes.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::clock::{Clock, MonotonicClock};
use sluice::config::load_sources;
use sluice::server::{self, Running};
use sluice::settings::{BackendKind, RedisModeArg, Settings};
use sluice_harness::rls::{self, header};
use sluice_harness::{RedisCluster, RedisServer};
use tonic::transport::Channel;

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;
const DAY_MS: u64 = 86_400_000;

/// Every rule under `client`, so all of one client's descriptors share a hash tag (one Cluster
/// slot, one script call) and a request over several of them is all-or-nothing in Cluster too.
const CONFIG: &str = r#"
domain: algos
descriptors:
  - key: client
    descriptors:
      - key: fixed
        rate_limit: {unit: day, requests_per_unit: 3, algorithm: fixed_window}
      - key: sliding
        rate_limit: {unit: day, requests_per_unit: 4, algorithm: sliding_window}
      - key: gcra
        rate_limit: {unit: hour, requests_per_unit: 2, burst: 2, algorithm: gcra}
      - key: bucket
        rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
      - key: switch
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: multi
        rate_limits:
          - {unit: second, requests_per_unit: 5}
          - {unit: second, unit_multiplier: 30, requests_per_unit: 8}
          - {unit: minute, unit_multiplier: 5, requests_per_unit: 10, algorithm: fixed_window}
"#;

/// Where the state lives in one run.
#[derive(Clone, Copy, Debug)]
enum Store<'a> {
    Memory,
    Redis(&'a str, RedisModeArg),
}

struct Sluice {
    running: Option<Running>,
    client: RateLimitServiceClient<Channel>,
    _dir: tempfile::TempDir,
}

impl Sluice {
    async fn start(store: Store<'_>, tweak: impl FnOnce(&mut Settings)) -> Sluice {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("algos.yaml"), CONFIG).unwrap();
        let mut settings = Settings::with_config(dir.path());
        settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
        settings.admin_addr = "127.0.0.1:0".parse().unwrap();
        settings.config_ops.watch_config = false;
        if let Store::Redis(urls, mode) = store {
            settings.backend = BackendKind::Redis;
            settings.redis_url = urls.split(',').map(str::to_owned).collect();
            settings.redis_mode = mode;
            // Generous: these tests check decisions, not latency, on a shared machine.
            settings.redis_timeout = Duration::from_secs(2);
            settings.redis_connect_timeout = Duration::from_secs(5);
            // These scenarios read every descriptor's state back after rejections; the
            // over-limit cache would answer those without asking (its own tests are in
            // integration/resilience.rs).
            settings.over_limit_cache = false;
        }
        settings.drain_delay = Duration::ZERO;
        tweak(&mut settings);
        let running = server::start(settings).await.expect("server starts");
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
            .await
            .expect("client connects");
        Sluice {
            running: Some(running),
            client,
            _dir: dir,
        }
    }

    fn admin(&self) -> SocketAddr {
        self.running.as_ref().unwrap().admin_addr
    }

    async fn call(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(request)
            .await
            .expect("call succeeds")
            .into_inner()
    }

    /// One descriptor `client=<client>, <rule>=x` of domain `algos`.
    async fn hit(&mut self, rule: &str, client: &str) -> RateLimitResponse {
        self.call(request(vec![descriptor(rule, client)])).await
    }

    async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await.expect("clean shutdown");
        }
    }
}

/// `client=<client>, <rule>=x`: the rule `rule` for one client.
fn descriptor(rule: &str, client: &str) -> RateLimitDescriptor {
    let entry = |key: &str, value: &str| Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    };
    RateLimitDescriptor {
        entries: vec![entry("client", client), entry(rule, "x")],
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "algos".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

fn seconds(response: &RateLimitResponse, name: &str) -> u64 {
    header(response, name)
        .unwrap_or_else(|| panic!("no {name} in {response:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number: {response:?}"))
}

/// `duration_until_reset` of the first status, in ms, and whether it is whole seconds.
fn reset_ms(response: &RateLimitResponse) -> (u64, bool) {
    let d = response.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset");
    (
        d.seconds as u64 * 1_000 + d.nanos as u64 / 1_000_000,
        d.nanos == 0,
    )
}

/// The wall clock (epoch ms), as both the memory backend and Redis `TIME` read it.
fn wall_ms() -> u64 {
    MonotonicClock::new().now_ms()
}

/// A client no other scenario of this process uses: scenarios share one server (and the memory
/// backend's state), and two can start within the same millisecond, so the wall clock alone
/// does not tell them apart.
fn fresh_client() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("client-{}-{n}", wall_ms())
}

/// A fresh client for a scenario that must stay within one window of `unit_ms`: when the
/// window ends within a minute, wait it out first (at most a minute, on few runs: 0.07% for a
/// day).
async fn client_clear_of(unit_ms: u64) -> String {
    client_clear_of_by(unit_ms, 60_000).await
}

/// [`client_clear_of`] for a scenario of a few seconds: a window ending within `margin_ms` is
/// waited out.
async fn client_clear_of_by(unit_ms: u64, margin_ms: u64) -> String {
    let to_end = unit_ms - wall_ms() % unit_ms;
    if to_end < margin_ms {
        tokio::time::sleep(Duration::from_millis(to_end + 100)).await;
    }
    fresh_client()
}

async fn client_for_today() -> String {
    client_clear_of(DAY_MS).await
}

/// The fixed window counts as envoyproxy/ratelimit does: 3 per UTC day, `limit_remaining`
/// counting down, then OVER_LIMIT until midnight UTC; the reset is the window's end in whole
/// seconds and `retry-after` says the same.
async fn fixed_window(s: &mut Sluice) {
    let client = client_for_today().await;
    {
        for remaining in [2, 1, 0] {
            let r = s.hit("fixed", &client).await;
            assert_eq!(r.overall_code, OK);
            assert_eq!(r.statuses[0].limit_remaining, remaining);
            assert_eq!(header(&r, "x-ratelimit-limit"), Some("3, 3;w=86400"));
            assert!(header(&r, "retry-after").is_none());
        }
        let now = wall_ms();
        let r = s.hit("fixed", &client).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        let to_midnight_s = (DAY_MS - now % DAY_MS).div_ceil(1_000);
        let (reset, whole) = reset_ms(&r);
        assert!(
            whole,
            "whole seconds, as envoyproxy/ratelimit reports: {reset} ms"
        );
        assert!(
            reset / 1_000 <= to_midnight_s && reset / 1_000 + 5 >= to_midnight_s,
            "reset {reset} ms, midnight in {to_midnight_s} s"
        );
        assert_eq!(seconds(&r, "x-ratelimit-reset"), reset / 1_000);
        assert_eq!(seconds(&r, "retry-after"), reset / 1_000);
        // Rejected hits are not counted: a check-only request sees the same count.
        let mut check = descriptor("fixed", &client);
        check.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        let r = s.call(request(vec![check])).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].limit_remaining, 0);
    }
}

/// The sliding window: 4 per sliding day. With nothing in yesterday's window it admits 4 today;
/// the fifth must wait for tomorrow, until today's 4 weigh at most 3: a quarter into the day.
async fn sliding_window(s: &mut Sluice) {
    let client = client_for_today().await;
    {
        for remaining in [3, 2, 1, 0] {
            let r = s.hit("sliding", &client).await;
            assert_eq!(r.overall_code, OK, "{r:?}");
            assert_eq!(r.statuses[0].limit_remaining, remaining);
        }
        let now = wall_ms();
        let r = s.hit("sliding", &client).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        let to_midnight_s = (DAY_MS - now % DAY_MS) / 1_000;
        let retry = seconds(&r, "retry-after");
        let expected = to_midnight_s + 86_400 / 4;
        assert!(
            retry <= expected + 1 && retry + 5 >= expected,
            "retry-after {retry}, expected about {expected}"
        );
        // Nothing is counted any more once today's hits have aged out of tomorrow's window.
        let reset = seconds(&r, "x-ratelimit-reset");
        let expected = to_midnight_s + 86_400;
        assert!(
            reset <= expected + 1 && reset + 5 >= expected,
            "x-ratelimit-reset {reset}, expected about {expected}"
        );
    }
}

/// GCRA, 2 per hour with a burst of 2: one every 30 minutes once the burst is spent, and the
/// retry-after is the exact wait.
async fn gcra(s: &mut Sluice) {
    let client = fresh_client();
    for remaining in [1, 0] {
        let r = s.hit("gcra", &client).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, remaining);
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("2, 2;w=3600"));
    }
    let r = s.hit("gcra", &client).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let retry = seconds(&r, "retry-after");
    assert!((1_795..=1_800).contains(&retry), "retry-after {retry}");
    let reset = seconds(&r, "x-ratelimit-reset");
    assert!(
        (3_595..=3_600).contains(&reset),
        "x-ratelimit-reset {reset}"
    );
    let (reset_ms, _) = reset_ms(&r);
    assert!(reset_ms > 3_590_000 && reset_ms <= 3_600_000, "{reset_ms}");
}

/// The token bucket beside them, unchanged: capacity 2, one token per 30 minutes.
async fn token_bucket(s: &mut Sluice) {
    let client = fresh_client();
    for remaining in [1, 0] {
        let r = s.hit("bucket", &client).await;
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    let r = s.hit("bucket", &client).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let retry = seconds(&r, "retry-after");
    assert!((1_795..=1_800).contains(&retry), "retry-after {retry}");
}

/// One request over all four algorithms: the full GCRA key rejects it and nothing is counted
/// in the others; the response's headers describe the rejecting descriptor.
async fn mixed_request_is_all_or_nothing(s: &mut Sluice) {
    let client = client_for_today().await;
    {
        let all = || {
            request(
                ["fixed", "sliding", "gcra", "bucket"]
                    .iter()
                    .map(|k| descriptor(k, &client))
                    .collect(),
            )
        };
        let r = s.call(all()).await;
        assert_eq!(r.overall_code, OK);
        let remaining: Vec<u32> = r.statuses.iter().map(|st| st.limit_remaining).collect();
        assert_eq!(remaining, [2, 3, 1, 1]);
        // Spend the GCRA burst on its own.
        s.hit("gcra", &client).await;
        for _ in 0..3 {
            let r = s.call(all()).await;
            assert_eq!(r.overall_code, OVER_LIMIT);
            let codes: Vec<i32> = r.statuses.iter().map(|st| st.code).collect();
            assert_eq!(codes, [OK, OK, OVER_LIMIT, OK]);
            let remaining: Vec<u32> = r.statuses.iter().map(|st| st.limit_remaining).collect();
            assert_eq!(remaining, [2, 3, 0, 1], "nothing counted anywhere");
            let retry = seconds(&r, "retry-after");
            assert!((1_795..=1_800).contains(&retry), "retry-after {retry}");
        }
    }
}

/// A request `limit` override takes the matched rule's algorithm, with its own key.
async fn override_keeps_the_rules_algorithm(s: &mut Sluice) {
    let client = client_for_today().await;
    {
        let overridden = || {
            let mut d = descriptor("fixed", &client);
            d.limit = Some(RateLimitOverride {
                requests_per_unit: 1,
                unit: 4, // DAY
            });
            request(vec![d])
        };
        let r = s.call(overridden()).await;
        assert_eq!(r.overall_code, OK);
        let r = s.call(overridden()).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        let (_, whole) = reset_ms(&r);
        assert!(whole, "a fixed window's reset, in whole seconds");
        // The configured rule's own window is untouched.
        let r = s.hit("fixed", &client).await;
        assert_eq!(r.statuses[0].limit_remaining, 2);
    }
}

/// A reload that changes a rule's algorithm starts it afresh under another key: the drained
/// token bucket is not misread as a window count, and switching back finds the bucket as it
/// was.
async fn reload_switches_algorithm_without_misreading_state(s: &mut Sluice) {
    let store = s.running.as_ref().unwrap().config.clone();
    let client = fresh_client();
    for _ in 0..2 {
        s.hit("switch", &client).await;
    }
    assert_eq!(s.hit("switch", &client).await.overall_code, OVER_LIMIT);
    let switched = CONFIG.replace(
        "rate_limit: {unit: hour, requests_per_unit: 2}\n",
        "rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}\n",
    );
    assert_ne!(switched, CONFIG);
    let load = |text: &str| load_sources(&[("algos.yaml".to_owned(), text.to_owned())]);
    assert!(store.install(load(&switched), "test: fixed window"));
    let r = s.hit("switch", &client).await;
    assert_eq!(r.overall_code, OK, "a new window, not the bucket's state");
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert!(store.install(load(CONFIG), "test: token bucket again"));
    let r = s.hit("switch", &client).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "the bucket is still drained");
}

/// Several limits on one key (`rate_limits`): a reload that removes one limit, or adds one,
/// keeps the state of the others (each limit's key is tagged by its window, not its place).
async fn reload_adding_and_removing_a_limit_keeps_the_others(s: &mut Sluice) {
    let store = s.running.as_ref().unwrap().config.clone();
    let load = |text: &str| load_sources(&[("algos.yaml".to_owned(), text.to_owned())]);
    let client = client_clear_of_by(300_000, 10_000).await;
    for _ in 0..3 {
        assert_eq!(s.hit("multi", &client).await.overall_code, OK);
    }
    let per_second = "          - {unit: second, requests_per_unit: 5}\n";
    let without = CONFIG.replace(per_second, "");
    assert_ne!(without, CONFIG);
    assert!(store.install(load(&without), "test: one limit fewer"));
    // The 30-second limit (8) has the fewest hits left: it kept the 3 taken before.
    let r = s.hit("multi", &client).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 4, "{r:?}");
    let with_more = CONFIG.replace(
        per_second,
        "          - {unit: hour, requests_per_unit: 1000}\n",
    );
    assert!(store.install(load(&with_more), "test: another limit"));
    let r = s.hit("multi", &client).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 3, "{r:?}");
    assert!(store.install(load(CONFIG), "test: the limits as they were"));
}

/// All scenarios on one running server (they use distinct descriptor values).
async fn suite(store: Store<'_>) {
    let mut s = Sluice::start(store, |_| {}).await;
    fixed_window(&mut s).await;
    sliding_window(&mut s).await;
    gcra(&mut s).await;
    token_bucket(&mut s).await;
    mixed_request_is_all_or_nothing(&mut s).await;
    override_keeps_the_rules_algorithm(&mut s).await;
    reload_switches_algorithm_without_misreading_state(&mut s).await;
    reload_adding_and_removing_a_limit_keeps_the_others(&mut s).await;
    s.stop().await;
}

#[tokio::test]
async fn every_algorithm_end_to_end_on_memory() {
    suite(Store::Memory).await;
}

#[tokio::test]
async fn every_algorithm_end_to_end_on_redis() {
    let server = RedisServer::start();
    suite(Store::Redis(&server.url(), RedisModeArg::Standalone)).await;
}

#[tokio::test]
async fn every_algorithm_end_to_end_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    suite(Store::Redis(
        &cluster.urls().join(","),
        RedisModeArg::Cluster,
    ))
    .await;
}

/// Two replicas on one Redis, asked in turn, hold every limit of a `rate_limits` descriptor:
/// back to back the per-second limit (5) binds; spread over 3 s the 30-second one (8) does; and
/// the 5-minute window counted exactly the admitted requests (a refused one charges no limit).
#[tokio::test]
async fn several_limits_hold_across_two_replicas_on_one_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let store = Store::Redis(&url, RedisModeArg::Standalone);
    let mut replicas = [
        Sluice::start(store, |_| {}).await,
        Sluice::start(store, |_| {}).await,
    ];
    let client = client_clear_of_by(300_000, 15_000).await;
    let started = wall_ms();
    let mut admitted = 0u64;
    for i in 0..10 {
        let r = replicas[i % 2].hit("multi", &client).await;
        admitted += u64::from(r.overall_code == OK);
    }
    let burst_s = (wall_ms() - started) as f64 / 1_000.0;
    assert!(
        admitted as f64 <= 5.0 + 5.0 * burst_s && admitted >= 5,
        "back to back: {admitted} admitted in {burst_s:.2} s"
    );
    for i in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = replicas[i % 2].hit("multi", &client).await;
        admitted += u64::from(r.overall_code == OK);
    }
    let span_s = (wall_ms() - started) as f64 / 1_000.0;
    let bound = 8.0 + 8.0 * span_s / 30.0;
    println!("{admitted} admitted in {span_s:.2} s (30-second bound {bound:.2})");
    assert!(
        admitted >= 8 && admitted as f64 <= bound,
        "{admitted} admitted in {span_s:.2} s, bound {bound:.2}"
    );
    let window_key = format!("sluice:{{algos|client={client}}}|multi=x~w300~fw");
    let counted: u64 = server.cmd(&["HGET", &window_key, "c"]);
    assert_eq!(
        counted, admitted,
        "the 5-minute window counts admitted requests only"
    );
    for replica in replicas {
        replica.stop().await;
    }
}

/// `--default-algorithm` (here set on the settings the flag fills) counts rules that name
/// no algorithm, and `GET /config` shows each rule's algorithm and where it came from.
#[tokio::test]
async fn the_default_algorithm_applies_and_the_config_dump_shows_it() {
    let mut s = Sluice::start(Store::Memory, |settings| {
        settings.config_ops.load.default_algorithm = sluice::algorithm::Algorithm::FixedWindow;
    })
    .await;
    let client = client_clear_of(3_600_000).await;
    // `switch` names no algorithm: now a fixed window of 2 per hour.
    for _ in 0..2 {
        assert_eq!(s.hit("switch", &client).await.overall_code, OK);
    }
    let r = s.hit("switch", &client).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert!(reset_ms(&r).1, "a fixed window's whole-second reset");
    let admin = s.admin();
    // A blocking client, off the runtime that serves the admin listener.
    let body = tokio::task::spawn_blocking(move || http_get(admin, "/config"))
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&body).expect("GET /config is JSON");
    let domain = &json["domains"][0];
    assert_eq!(domain["algorithm"], "fixed_window", "{body}");
    assert_eq!(domain["algorithm_from"], "default");
    let rules = domain["rules"].as_array().expect("rules");
    let by_path = |path: &str| {
        rules
            .iter()
            .find(|r| r["path"] == path)
            .unwrap_or_else(|| panic!("{path} in {body}"))
    };
    assert_eq!(by_path("algos.client.switch")["algorithm"], "fixed_window");
    assert_eq!(by_path("algos.client.switch")["algorithm_from"], "default");
    assert_eq!(by_path("algos.client.gcra")["algorithm"], "gcra");
    assert_eq!(by_path("algos.client.gcra")["algorithm_from"], "rule");
    s.stop().await;
}

/// `GET path` of the admin listener, which must answer 200: the body.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let (status, body) = rls::http_get(addr, path);
    assert_eq!(status, 200, "{body}");
    body
}
