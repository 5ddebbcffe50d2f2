//! RLQS (`StreamRateLimitQuotas`) across real processes: simulated Envoy data planes
//! (`sluice_harness::rlqs::DataPlane`) in front of `sluice serve` replicas sharing one
//! redis-server, under steady, skewed and churning demand, a replica SIGKILLed, Redis killed, a
//! reload that removes the rule, and RLS calls charging the same bucket.
//!
//! The invariant is the prepaid bound of `sluice_core::quota::pool`: over a span T the data planes
//! admit at most C + r·T plus the grant slack. Every member's share of one replica's pool is at
//! most the rule's rate, so the slack — Σ (max_tokens + rate·ttl) over the members, with
//! max_tokens ≤ rate·push_interval + 1 — is at most pools · r · (push + ttl) + members, where
//! pools is the number of replicas holding members. The data planes deny before their first
//! assignment and after one expires (`no_assignment` and `expired_assignment_behavior` of
//! DENY_ALL), as an operator who wants the bound configures Envoy: ALLOW_ALL there admits what
//! no one paid for. Figures are printed on `RLQS` lines
//! (`cargo nextest run -p sluice --test rlqs --no-capture`); assertions are on counts with
//! margins, never on timings.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use futures::future::join_all;
use sluice_harness::rlqs::{
    AssignmentKind, BucketId, DataPlane, ExpiredBehavior, Settings, Strategy, bucket,
};
use sluice_harness::rls::{OK, desc, http_get, req};
use sluice_harness::{RedisServer, without_sluice_env};
use tokio::time::{Instant, sleep};

/// The rule every load test shares: capacity C = 100 tokens, refill r = 100 per second, so a run
/// of several seconds is mostly refill and the ratio says something about the rate.
const CAPACITY: f64 = 100.0;
const RATE_PER_S: f64 = 100.0;
const MESH: &str = r#"
domain: mesh
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: open_route
    failure_mode: open
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: closed_route
    failure_mode: closed
    rate_limit: {unit: second, requests_per_unit: 100}
"#;

/// `--rlqs-push-interval` and `--rlqs-assignment-ttl` the replicas run with, stated so the slack
/// below follows them: pushes faster than the default (1 s) so these 8 s runs see many, and the
/// shortest TTL Envoy can read (whole seconds).
const PUSH: Duration = Duration::from_millis(200);
const TTL: Duration = Duration::from_secs(1);

/// How long each load runs.
const RUN: Duration = Duration::from_secs(8);

/// A bounded wait for something the system does on its own (a reconnect, a refill, a reload).
const SETTLE: Duration = Duration::from_secs(20);

fn tenant() -> BucketId {
    bucket(&[("tenant", "acme")])
}

/// Envoy's filter as an operator who wants the bound configures it: deny until assigned and
/// after an assignment expired; report four times a second.
fn strict() -> Settings {
    Settings {
        reporting_interval: Duration::from_millis(250),
        no_assignment: Strategy::DenyAll,
        expired: ExpiredBehavior::Fallback(Strategy::DenyAll),
    }
}

/// A blocking call (HTTP to the admin port, process signals) without stalling the load.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A `sluice serve` child process on loopback ports; SIGKILLed on drop.
struct Replica {
    child: Option<Child>,
    grpc: SocketAddr,
    admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl Replica {
    fn start(config: &str, redis: &RedisServer) -> Replica {
        // The log sits beside the config dir, not in it: the file watcher must not see it.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("config")).unwrap();
        std::fs::write(dir.path().join("config/mesh.yaml"), config).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        without_sluice_env(&mut cmd);
        cmd.args(["serve", "--config"])
            .arg(dir.path().join("config"))
            .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(["--backend", "redis", "--redis-url", &redis.url()])
            // Generous: a busy 2-core machine must not turn a slow reply into a failure policy.
            .args(["--redis-timeout", "500ms", "--redis-connect-timeout", "2s"])
            .args(["--rlqs-push-interval", &format!("{}ms", PUSH.as_millis())])
            .args(["--rlqs-assignment-ttl", &format!("{}s", TTL.as_secs())])
            .args(["--watch-debounce", "50ms"])
            .env("SLUICE_LOG_FORMAT", "text")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("sluice.log")).unwrap())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn sluice");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let field = |name: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in the ready line: {line:?}"))
                .parse()
                .unwrap()
        };
        let (grpc, admin) = (field("grpc="), field("admin="));
        Replica {
            child: Some(child),
            grpc,
            admin,
            dir,
        }
    }

    /// A counter or gauge from `/metrics`, summed over its label sets.
    fn metric(&self, name: &str) -> f64 {
        metric_in(&self.get("/metrics"), name)
    }

    fn get(&self, path: &str) -> String {
        let (status, body) = http_get(self.admin, path);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Successful config loads so far (1 after the start).
    fn loads_ok(&self) -> u64 {
        let json: serde_json::Value = serde_json::from_str(&self.get("/config")).unwrap();
        json["loads"]["ok"].as_u64().expect("loads.ok")
    }

    fn config_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("config")
    }

    /// SIGKILL: no drain, no clean end of its streams beyond what the kernel does.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the process group this struct created and has not reaped.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("sluice.log"));
            eprintln!(
                "--- log of the replica at {} ---\n{}",
                self.grpc,
                log.unwrap_or_default()
            );
        }
    }
}

fn metric_in(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `ready` every 20 ms; panics with `what` after [`SETTLE`].
async fn settle(what: &str, mut ready: impl FnMut() -> bool) {
    let give_up = Instant::now() + SETTLE;
    while !ready() {
        assert!(
            Instant::now() < give_up,
            "timed out after {SETTLE:?} waiting for {what}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// The prepaid bound over a span: C + r·T, and the grant slack of `pools` replicas' pools with
/// `members` subscriptions between them (see the module docs).
#[derive(Clone, Copy, Debug)]
struct Bound {
    base: f64,
    slack: f64,
}

impl Bound {
    fn new(span: Duration, pools: usize, members: usize) -> Bound {
        let window = (PUSH + TTL).as_secs_f64();
        Bound {
            base: CAPACITY + RATE_PER_S * span.as_secs_f64(),
            slack: pools as f64 * RATE_PER_S * window + members as f64,
        }
    }

    fn total(&self) -> f64 {
        self.base + self.slack
    }

    /// Prints the figures and asserts `admitted` within the bound; returns admitted / (C + r·T).
    fn check(&self, test: &str, admitted: u64, span: Duration) -> f64 {
        let ratio = admitted as f64 / self.base;
        println!(
            "RLQS {test}: admitted {admitted} over {:.2} s; C + r·T = {:.0}, slack {:.0}, \
             bound {:.0}; admitted/(C + r·T) = {ratio:.3}",
            span.as_secs_f64(),
            self.base,
            self.slack,
            self.total()
        );
        assert!(
            admitted as f64 <= self.total(),
            "{test}: admitted {admitted} > bound {:.0} (C + r·T {:.0} + slack {:.0})",
            self.total(),
            self.base,
            self.slack
        );
        ratio
    }
}

/// Every admitted request of `bucket` over the data planes, in time order.
fn admissions<'a>(planes: impl IntoIterator<Item = &'a DataPlane>, id: &BucketId) -> Vec<Instant> {
    let mut all: Vec<Instant> = planes
        .into_iter()
        .flat_map(|dp| dp.stats(id).admitted_at)
        .collect();
    all.sort();
    all
}

/// The span from the first to the last admission (zero when fewer than two).
fn span(admitted: &[Instant]) -> Duration {
    match (admitted.first(), admitted.last()) {
        (Some(first), Some(last)) => *last - *first,
        _ => Duration::ZERO,
    }
}

/// The most admissions within any window of `window`, with the window's bound.
fn worst_window(admitted: &[Instant], window: Duration) -> u64 {
    let mut best = 0;
    let mut end = 0;
    for (start, first) in admitted.iter().enumerate() {
        end = end.max(start);
        while end < admitted.len() && admitted[end] <= *first + window {
            end += 1;
        }
        best = best.max(end - start);
    }
    best as u64
}

/// Checks the bound over the whole run and over the worst 2-second window.
fn check_bound(test: &str, admitted: &[Instant], pools: usize, members: usize) -> f64 {
    let whole = span(admitted);
    let ratio = Bound::new(whole, pools, members).check(test, admitted.len() as u64, whole);
    let window = Duration::from_secs(2);
    Bound::new(window, pools, members).check(
        &format!("{test} (worst 2 s window)"),
        worst_window(admitted, window),
        window,
    );
    ratio
}

/// Test 1: three data planes on two replicas, demand 1.8× the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_demand_above_the_limit_stays_within_the_bound() {
    let redis = blocking(RedisServer::start);
    let replicas = blocking(|| [Replica::start(MESH, &redis), Replica::start(MESH, &redis)]);
    let id = tenant();
    let planes: Vec<DataPlane> = (0..3)
        .map(|i| DataPlane::connect(replicas[i % 2].grpc, "mesh", strict()))
        .collect();
    let offered: Vec<_> = join_all(planes.iter().map(|dp| dp.offer(&id, 60.0, RUN))).await;

    let admitted = admissions(&planes, &id);
    let ratio = check_bound("steady 3 DP × 2 replicas", &admitted, 2, 3);
    for (i, (dp, load)) in planes.iter().zip(&offered).enumerate() {
        println!(
            "RLQS steady: data plane {i}: offered {} admitted {} denied {}; assignments {}",
            load.offered,
            load.admitted,
            load.denied,
            dp.stats(&id).assignments
        );
        assert!(load.admitted > 0, "data plane {i} admitted nothing");
    }
    let slack: f64 = blocking(|| {
        replicas
            .iter()
            .map(|r| r.metric("sluice_rlqs_grant_slack_total"))
            .sum()
    });
    println!("RLQS steady: utilisation {ratio:.3}; sluice_rlqs_grant_slack_total {slack}");
    // Demand is 1.8× the limit: at least half of what the bucket gave must reach the data
    // planes (what the pools hold ahead and denials before the first assignment cost some).
    assert!(ratio >= 0.5, "utilisation {ratio:.3} below 0.5");
    for dp in planes {
        dp.close().await;
    }
}

/// Test 2: one data plane asks 10× what each of the two others asks; together 1.2× the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_demand_the_quiet_data_planes_get_what_they_ask() {
    let redis = blocking(RedisServer::start);
    let replicas = blocking(|| [Replica::start(MESH, &redis), Replica::start(MESH, &redis)]);
    let id = tenant();
    let planes: Vec<DataPlane> = (0..3)
        .map(|i| DataPlane::connect(replicas[i % 2].grpc, "mesh", strict()))
        .collect();
    let rates = [100.0, 10.0, 10.0];
    let offered: Vec<_> = join_all(
        planes
            .iter()
            .zip(rates)
            .map(|(dp, rate)| dp.offer(&id, rate, RUN)),
    )
    .await;

    let admitted = admissions(&planes, &id);
    check_bound("skewed 100/10/10 per s", &admitted, 2, 3);
    for (i, load) in offered.iter().enumerate() {
        let got = load.admitted as f64 / load.offered as f64;
        println!(
            "RLQS skewed: data plane {i} at {} per s: offered {} admitted {} ({got:.3})",
            rates[i], load.offered, load.admitted
        );
        // A quiet one wants a tenth of an even share. On the busy one's replica (plane 2) the
        // pool's max-min split serves it first: it is denied only before its first assignment
        // and while its share is being learnt (seen: 0.988 alone, lower on a loaded machine).
        // On the other replica (plane 1) its pool competes with the busy one's through the
        // shared bucket, whose takes are first come, first served; with a whole-second TTL
        // prepaid the busy pool takes more per push (seen: 0.50–0.84; 0.96+ with the 600 ms TTL
        // Envoy could not read). Replicas do not share demand: docs/rlqs.md.
        let floor = if i == 2 {
            0.7
        } else if i == 1 {
            0.4
        } else {
            0.0
        };
        assert!(
            got >= floor,
            "quiet data plane {i} got {got:.3} of its demand (floor {floor})"
        );
    }
    assert!(
        offered[0].admitted > offered[1].admitted + offered[2].admitted,
        "the busy data plane admitted {}, less than the quiet ones together",
        offered[0].admitted
    );
    for dp in planes {
        dp.close().await;
    }
}

/// Test 3: a data plane joins mid-run, one leaves by closing its stream, one by crashing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_planes_joining_and_leaving_keep_the_bound_and_leave_no_subscription() {
    let redis = blocking(RedisServer::start);
    let replicas = blocking(|| [Replica::start(MESH, &redis), Replica::start(MESH, &redis)]);
    let id = tenant();
    let subscribed = |r: &Replica| blocking(|| r.metric("sluice_rlqs_buckets_subscribed"));
    // Stay for the whole run: one on each replica.
    let stay: Vec<DataPlane> = (0..2)
        .map(|i| DataPlane::connect(replicas[i].grpc, "mesh", strict()))
        .collect();
    // Leave at a third of the run: the closer on replica 0, the crasher on replica 1.
    let closer = DataPlane::connect(replicas[0].grpc, "mesh", strict());
    let crasher = DataPlane::connect(replicas[1].grpc, "mesh", strict());
    let third = RUN / 3;

    let staying = join_all(stay.iter().map(|dp| dp.offer(&id, 60.0, RUN)));
    let leavers = async {
        tokio::join!(
            closer.offer(&id, 60.0, third),
            crasher.offer(&id, 60.0, third)
        );
        let before = [subscribed(&replicas[0]), subscribed(&replicas[1])];
        let gone = admissions([&closer, &crasher], &id);
        let closer_counters = closer.counters();
        closer.close().await;
        crasher.crash();
        (before, gone, closer_counters)
    };
    let joining = async {
        sleep(third * 2 - third / 2).await;
        let newcomer = DataPlane::connect(replicas[0].grpc, "mesh", strict());
        let load = newcomer.offer(&id, 60.0, RUN - third * 2).await;
        (newcomer, load)
    };
    let (offered, (before, left_admitted, closer_counters), (newcomer, joined)) =
        tokio::join!(staying, leavers, joining);

    let mut admitted = admissions(stay.iter().chain([&newcomer]), &id);
    admitted.extend(left_admitted);
    admitted.sort();
    check_bound("join and leave (5 DP over the run)", &admitted, 2, 5);
    for (i, load) in offered.iter().enumerate() {
        println!(
            "RLQS churn: staying data plane {i}: offered {} admitted {}",
            load.offered, load.admitted
        );
    }
    let assignments = newcomer.stats(&id).assignments;
    println!(
        "RLQS churn: newcomer offered {} admitted {}, assignments {assignments}; the closer \
         opened {} stream(s)",
        joined.offered, joined.admitted, closer_counters.streams_opened
    );
    assert!(assignments > 0, "the newcomer got no assignment");
    assert!(joined.admitted > 0, "the newcomer admitted nothing");
    // Each replica had its staying data plane and a leaver subscribed; the newcomer joins
    // replica 0 after the leavers went. The leavers' subscriptions must be gone.
    assert_eq!(before, [2.0, 2.0], "subscriptions before the leavers left");
    let after = [subscribed(&replicas[0]), subscribed(&replicas[1])];
    println!("RLQS churn: sluice_rlqs_buckets_subscribed before {before:?}, after {after:?}");
    assert_eq!(after, [2.0, 1.0], "subscriptions after the run");
    for dp in stay.into_iter().chain([newcomer]) {
        dp.close().await;
    }
    settle("every subscription gone after the closes", || {
        subscribed(&replicas[0]) == 0.0 && subscribed(&replicas[1]) == 0.0
    })
    .await;
}

/// Test 4: a replica is SIGKILLed mid-run; its data planes move to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_s_data_planes_move_to_the_survivor_within_the_bound() {
    let redis = blocking(RedisServer::start);
    let mut replicas = blocking(|| [Replica::start(MESH, &redis), Replica::start(MESH, &redis)]);
    let (a, b) = (replicas[0].grpc, replicas[1].grpc);
    let id = tenant();
    // Two on replica A (B listed second), one on B (A second), as Envoy clusters listing both.
    let planes = [
        DataPlane::connect_any(&[a, b], "mesh", strict()),
        DataPlane::connect_any(&[b, a], "mesh", strict()),
        DataPlane::connect_any(&[a, b], "mesh", strict()),
    ];
    let kill_at = RUN * 2 / 5;
    let load = join_all(planes.iter().map(|dp| dp.offer(&id, 60.0, RUN)));
    let killer = async {
        sleep(kill_at).await;
        let before: Vec<u64> = planes.iter().map(|dp| dp.stats(&id).assignments).collect();
        blocking(|| replicas[0].kill());
        let killed_at = Instant::now();
        // The moved data planes get assignments from the survivor again.
        let moved = [&planes[0], &planes[2]];
        for (dp, was) in moved.iter().zip([before[0], before[2]]) {
            dp.wait_until("an assignment from the survivor", SETTLE, |dp| {
                dp.stats(&id).assignments > was
                    && dp.counters().streams_opened >= 2
                    && matches!(dp.assignment(&id), Some(AssignmentKind::TokenBucket(_)))
            })
            .await;
        }
        (before, killed_at.elapsed())
    };
    let (offered, (before, moved_after)) = tokio::join!(load, killer);

    let admitted = admissions(&planes, &id);
    // Replica A's pool held tokens before the kill, B's over the whole run.
    check_bound("replica SIGKILLed", &admitted, 2, 5);
    for (i, (dp, load)) in planes.iter().zip(&offered).enumerate() {
        let counters = dp.counters();
        println!(
            "RLQS kill: data plane {i}: offered {} admitted {}; assignments {} before the kill, \
             {} in all; streams opened {}, failures {}, reports lost {}",
            load.offered,
            load.admitted,
            before[i],
            dp.stats(&id).assignments,
            counters.streams_opened,
            counters.stream_failures,
            counters.reports_lost
        );
    }
    println!(
        "RLQS kill: both moved data planes assigned again {:.2} s after the kill",
        moved_after.as_secs_f64()
    );
    let survivor = blocking(|| replicas[1].metric("sluice_rlqs_buckets_subscribed"));
    assert_eq!(survivor, 3.0, "the survivor serves all three data planes");
    for dp in planes {
        dp.close().await;
    }
}

/// Test 5: Redis killed: `open` assigns ALLOW_ALL, `closed` DENY_ALL; when Redis is back no data
/// plane stays denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_failure_modes_assign_and_recover() {
    let mut redis = blocking(RedisServer::start);
    let replicas = blocking(|| [Replica::start(MESH, &redis), Replica::start(MESH, &redis)]);
    let open = bucket(&[("open_route", "x")]);
    let closed = bucket(&[("closed_route", "x")]);
    let planes: Vec<DataPlane> = replicas
        .iter()
        .map(|r| DataPlane::connect(r.grpc, "mesh", strict()))
        .collect();
    let is_bucket =
        |kind: Option<AssignmentKind>| matches!(kind, Some(AssignmentKind::TokenBucket(_)));
    // Light demand, well within the limit (a request per bucket every 100 ms of polling, on each
    // data plane): while Redis answers, the assignments are token buckets.
    let polls = std::sync::atomic::AtomicU64::new(0);
    let drive = |dp: &DataPlane| {
        if polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .is_multiple_of(10)
        {
            dp.try_request(&open);
            dp.try_request(&closed);
        }
    };
    for dp in &planes {
        dp.try_request(&open);
        dp.try_request(&closed);
    }
    for dp in &planes {
        dp.wait_until("token buckets while Redis is up", SETTLE, |dp| {
            drive(dp);
            is_bucket(dp.assignment(&open)) && is_bucket(dp.assignment(&closed))
        })
        .await;
    }

    let killed = Instant::now();
    blocking(|| redis.kill());
    for dp in &planes {
        dp.wait_until("the failure policies' assignments", SETTLE, |dp| {
            drive(dp);
            dp.assignment(&open) == Some(AssignmentKind::AllowAll)
                && dp.assignment(&closed) == Some(AssignmentKind::DenyAll)
        })
        .await;
    }
    println!(
        "RLQS redis down: open → ALLOW_ALL and closed → DENY_ALL on both data planes {:.2} s \
         after the kill",
        killed.elapsed().as_secs_f64()
    );
    // Under ALLOW_ALL the open bucket admits everything; under DENY_ALL the closed one nothing.
    let probe: Vec<(bool, bool)> = planes
        .iter()
        .map(|dp| (dp.try_request(&open), dp.try_request(&closed)))
        .collect();
    assert!(
        probe.iter().all(|&(o, c)| o && !c),
        "open admits, closed denies: {probe:?}"
    );

    blocking(|| redis.start_again());
    let back = Instant::now();
    for dp in &planes {
        dp.wait_until("token buckets again once Redis is back", SETTLE, |dp| {
            drive(dp);
            is_bucket(dp.assignment(&open)) && is_bucket(dp.assignment(&closed))
        })
        .await;
    }
    println!(
        "RLQS redis back: both data planes on token buckets for both buckets {:.2} s after the \
         restart",
        back.elapsed().as_secs_f64()
    );
    let sent: Vec<f64> = blocking(|| {
        replicas
            .iter()
            .map(|r| {
                let text = r.get("/metrics");
                metric_in(
                    &text
                        .lines()
                        .filter(|l| l.contains("kind=\"deny_all\""))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    "sluice_rlqs_assignments_sent_total",
                )
            })
            .collect()
    });
    println!("RLQS redis: deny_all assignments sent per replica {sent:?}");
    assert!(sent.iter().all(|n| *n > 0.0), "every replica sent DENY_ALL");
    for dp in planes {
        dp.close().await;
    }
}

/// Test 6: a reload that removes the bucket's rule abandons it; the bucket comes back rule-less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_removing_the_rule_abandons_the_bucket() {
    let redis = blocking(RedisServer::start);
    let replicas = blocking(|| [Replica::start(MESH, &redis), Replica::start(MESH, &redis)]);
    let id = tenant();
    let planes: Vec<DataPlane> = replicas
        .iter()
        .map(|r| DataPlane::connect(r.grpc, "mesh", strict()))
        .collect();
    for dp in &planes {
        dp.wait_until("a token bucket", SETTLE, |dp| {
            dp.try_request(&id);
            matches!(dp.assignment(&id), Some(AssignmentKind::TokenBucket(_)))
        })
        .await;
    }
    let without_tenant: String = MESH.replace(
        "  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
        "",
    );
    assert_ne!(without_tenant, MESH);
    for replica in &replicas {
        let loads = blocking(|| replica.loads_ok());
        std::fs::write(replica.config_dir().join("mesh.yaml"), &without_tenant).unwrap();
        settle("the reload", || blocking(|| replica.loads_ok()) > loads).await;
    }
    for dp in &planes {
        dp.wait_until("the abandon", SETTLE, |dp| dp.counters().abandons > 0)
            .await;
    }
    // Requests go on: the bucket subscribes again and, with no rule, is allowed for good.
    for dp in &planes {
        dp.wait_until("a standing ALLOW_ALL", SETTLE, |dp| {
            dp.try_request(&id);
            dp.assignment(&id) == Some(AssignmentKind::AllowAll)
        })
        .await;
    }
    for (i, dp) in planes.iter().enumerate() {
        let stats = dp.stats(&id);
        println!(
            "RLQS reload: data plane {i}: abandons {}, subscriptions {}, assignments {}",
            stats.abandons, stats.subscriptions, stats.assignments
        );
        assert_eq!(stats.abandons, 1, "data plane {i}");
        assert_eq!(
            stats.subscriptions, 2,
            "data plane {i} subscribed again once"
        );
    }
    let abandons: f64 = blocking(|| {
        replicas
            .iter()
            .map(|r| {
                let text = r.get("/metrics");
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains("kind=\"abandon\""))
                    .collect();
                metric_in(&lines.join("\n"), "sluice_rlqs_assignments_sent_total")
            })
            .sum()
    });
    println!("RLQS reload: abandon actions sent {abandons}");
    assert_eq!(abandons, 2.0);
    for dp in planes {
        dp.close().await;
    }
}

/// RLS calls and RLQS data planes on the same descriptor charge one bucket: together within one
/// bound, where two buckets would admit nearly twice as much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_and_rlqs_on_one_descriptor_share_one_bucket() {
    let redis = blocking(RedisServer::start);
    let replicas = blocking(|| [Replica::start(MESH, &redis), Replica::start(MESH, &redis)]);
    let id = tenant();
    let planes: Vec<DataPlane> = replicas
        .iter()
        .map(|r| DataPlane::connect(r.grpc, "mesh", strict()))
        .collect();
    // RLS: 40 calls a second on each replica; RLQS: 60 a second on each data plane. Either alone
    // asks more than the limit.
    let rls = replicas.iter().map(|r| {
        let addr = r.grpc;
        async move {
            let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("RLS client connects");
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            let until = Instant::now() + RUN;
            let mut ok = Vec::new();
            let mut calls = 0u64;
            while Instant::now() < until {
                tick.tick().await;
                let sent = Instant::now();
                let reply = client
                    .should_rate_limit(req("mesh", vec![desc(&[("tenant", "acme")])]))
                    .await
                    .expect("RLS call");
                calls += 1;
                if reply.into_inner().overall_code == OK {
                    ok.push(sent);
                }
            }
            (calls, ok)
        }
    });
    let (rls, offered) = tokio::join!(
        join_all(rls),
        join_all(planes.iter().map(|dp| dp.offer(&id, 60.0, RUN)))
    );

    let rlqs_admitted = admissions(&planes, &id);
    let mut all = rlqs_admitted.clone();
    let mut calls = 0;
    for (n, ok) in &rls {
        calls += n;
        all.extend(ok);
    }
    all.sort();
    let rls_ok = all.len() - rlqs_admitted.len();
    let offered_rlqs: u64 = offered.iter().map(|l| l.offered).sum();
    println!(
        "RLQS shared: RLS {rls_ok} OK of {calls} calls, RLQS {} admitted of {offered_rlqs} offered",
        rlqs_admitted.len()
    );
    check_bound("RLS + RLQS on one descriptor", &all, 2, 2);
    assert!(rls_ok > 0, "RLS got nothing");
    assert!(!rlqs_admitted.is_empty(), "RLQS got nothing");
    for dp in planes {
        dp.close().await;
    }
}
