//! sluice's RLQS behind real Envoys through what operations do to a deployment: skewed demand,
//! an Envoy joining and one leaving, a sluice replica SIGKILLed, a reload that removes the rule,
//! and the load stopping after every Envoy was driven to deny. Envoy must never crash, none may
//! stay denied once the bucket refilled, and what they admit stays within the documented bound
//! C + r·T + slack (docs/rlqs.md). Figures are printed (`--no-capture`); assertions are on counts
//! with margins, never on timings alone.

use std::time::Duration;

use serde_json::json;
use sluice_harness::rlqs_envoy::{
    DATA_PLANE_SLACK, TIGHT_CAPACITY, TIGHT_RATE, TIGHT_RULE, Tally, assert_within_bound,
    assignments_sent, bucket_settings, drive, get_all, now, quota_bootstrap, wait_for_assignment,
};
use sluice_harness::{Envoy, HttpClient, RedisServer, SluiceProcess};

const USER: &[(&str, &[u8])] = &[("x-user", b"shared")];

const SECOND: Duration = Duration::from_secs(1);

/// Envoy alive and answering on its admin.
fn assert_alive(envoy: &mut Envoy) {
    assert!(envoy.is_running(), "Envoy exited; log:\n{}", envoy.log());
    assert_eq!(envoy.admin_get("/ready").status, 200, "Envoy is not ready");
}

fn subscribed(sluice: &SluiceProcess) -> f64 {
    sluice.metric("sluice_rlqs_buckets_subscribed", &[])
}

fn streams(sluice: &SluiceProcess) -> f64 {
    sluice.metric("sluice_rlqs_streams_open", &[])
}

/// Two `sluice serve` replicas of [`TIGHT_RULE`] on `redis`.
fn two_replicas(redis: &RedisServer) -> [SluiceProcess; 2] {
    [0, 1].map(|_| SluiceProcess::start_on_redis(&[("edge.yaml", TIGHT_RULE)], redis))
}

/// Each client's first request (it subscribes the bucket; admitted under Envoy's default
/// ALLOW_ALL): how many were admitted.
fn subscribe(clients: &mut [HttpClient]) -> usize {
    clients
        .iter_mut()
        .map(|c| usize::from(c.get("/", USER).status == 200))
        .sum()
}

fn admitted(tallies: &[Tally]) -> usize {
    tallies.iter().map(|t| t.admitted).sum()
}

/// After a load: per client, the second (from 0) of its first admission at one request a second,
/// what it sent and got over the last seconds, and in all.
#[derive(Debug)]
struct Recovery {
    first_admitted: Vec<Option<usize>>,
    tail: Vec<Tally>,
    all: Vec<Tally>,
}

/// How long [`one_a_second`] runs, and the tail it asserts on. After a hammer sluice learns that
/// the demand fell from Envoy's next reports (every 5 s; each halves the smoothed demand), so
/// an Envoy sharing its replica with another was seen admitting again only 4 s after the stop
/// and 1 of 5 in seconds 5-10 once; the tail starts two reports after the stop. Seen in the
/// tail: 3 to 5 of 5 each, 3 with the machine's load at 16 on 2 cores.
const RECOVERY_SECONDS: usize = 15;
const TAIL_SECONDS: usize = 5;

/// One request a second through each client for [`RECOVERY_SECONDS`].
fn one_a_second(clients: &mut [HttpClient]) -> Recovery {
    let (seconds, tail) = (RECOVERY_SECONDS, TAIL_SECONDS);
    let period = vec![Some(Duration::from_secs(1)); clients.len()];
    let per_second: Vec<Vec<Tally>> = (0..seconds)
        .map(|_| drive(clients, &period, USER, Duration::from_secs(1)))
        .collect();
    let client = |i: usize| per_second.iter().map(move |s| s[i]);
    let sum = |i: usize, skip: usize| Tally {
        offered: client(i).skip(skip).map(|t| t.offered).sum(),
        admitted: client(i).skip(skip).map(|t| t.admitted).sum(),
    };
    Recovery {
        first_admitted: (0..clients.len())
            .map(|i| client(i).position(|t| t.admitted > 0))
            .collect(),
        tail: (0..clients.len()).map(|i| sum(i, seconds - tail)).collect(),
        all: (0..clients.len()).map(|i| sum(i, 0)).collect(),
    }
}

impl Recovery {
    /// Every client admitted again, and at least `floor` of its tail.
    fn assert_not_denied(&self, what: &str, floor: f64) {
        for (i, t) in self.tail.iter().enumerate() {
            assert!(
                self.first_admitted[i].is_some(),
                "{what}: Envoy {i} stayed denied"
            );
            assert!(
                t.share() >= floor,
                "{what}: Envoy {i} admitted {t:?} at 1/s (floor {floor})"
            );
        }
    }
}

/// One Envoy hammers, two ask 1 request a second each (the rule's fair share of three is 5/3 a
/// second): one quiet Envoy on the busy one's replica, one on the other replica, for 20 s.
#[test]
fn skewed_demand_keeps_the_bound_and_does_not_starve_the_quiet_envoys() {
    let redis = RedisServer::start();
    let replicas = two_replicas(&redis);
    // busy and quiet_same on replica 0, quiet_other on replica 1.
    let mut envoys = [0, 0, 1].map(|r| Envoy::start(&quota_bootstrap(&[replicas[r].grpc])));
    let mut clients: Vec<HttpClient> = envoys.iter().map(Envoy::client).collect();
    let started = now();
    let first = subscribe(&mut clients);
    replicas.iter().for_each(wait_for_assignment);
    let second = Some(Duration::from_secs(1));
    let run = Duration::from_secs(20);
    let tallies = drive(&mut clients, &[None, second, second], USER, run);
    let span = started.elapsed().as_secs_f64();
    for (name, t) in ["busy", "quiet, busy's replica", "quiet, other replica"]
        .iter()
        .zip(&tallies)
    {
        println!(
            "skewed: {name}: {} of {} admitted ({:.2})",
            t.admitted,
            t.offered,
            t.share()
        );
    }
    assert_within_bound(
        "skewed demand, 3 Envoys on 2 replicas",
        first + admitted(&tallies),
        span,
        3.0 * DATA_PLANE_SLACK,
    );
    // A quiet Envoy asks 0.6 of a fair share. On the busy one's replica the pool's max-min split
    // serves it, denied while its first reports teach sluice its demand (seen 0.85 twice; 0.44
    // and 0.45 with the machine's load at 16-25 on 2 cores). On the other replica its pool
    // competes with the busy one's through the shared bucket, first come first served, each
    // pool planning with the rule's whole rate (seen 0.30, 0.35, 0.45, 0.56): the cross-replica
    // gap of docs/rlqs.md. The busy Envoy is not asserted on: at a load of 25 it admitted 6.
    let floors = [0.0, 0.3, 0.15];
    for (i, t) in tallies.iter().enumerate() {
        assert!(
            t.share() >= floors[i],
            "Envoy {i} got {:.2} of its demand (floor {})",
            t.share(),
            floors[i]
        );
    }
    envoys.iter_mut().for_each(assert_alive);
}

/// Four Envoys on two replicas hammer for 5 s; one is stopped (SIGTERM, a scale-down), one
/// killed (SIGKILL, a crash) and a fifth starts; three hammer for 5 s more, then ask 1/s each
/// for 15 s: one bound over the whole run, the leavers' subscriptions gone from sluice at once,
/// the others (the newcomer too) not left denied.
#[test]
fn envoys_joining_and_leaving_keep_the_bound_and_leave_no_subscription() {
    let redis = RedisServer::start();
    let replicas = two_replicas(&redis);
    // Staying A on replica 0 and B on replica 1; then the stopped one (0), the killed one (1).
    let mut envoys: Vec<Envoy> = [0, 1, 0, 1]
        .map(|r| Envoy::start(&quota_bootstrap(&[replicas[r].grpc])))
        .into();
    let mut clients: Vec<HttpClient> = envoys.iter().map(Envoy::client).collect();
    let started = now();
    let first = subscribe(&mut clients);
    replicas.iter().for_each(wait_for_assignment);
    let before = drive(&mut clients, &[None; 4], USER, Duration::from_secs(5));
    let subscribed_before = replicas.each_ref().map(subscribed);
    assert_eq!(subscribed_before, [2.0, 2.0], "before the leavers left");

    drop(envoys.pop()); // SIGKILL
    let status = envoys.pop().unwrap().terminate();
    let left = now();
    sluice_harness::wait_until("the leavers' subscriptions gone", SECOND * 5, || {
        replicas.each_ref().map(subscribed) == [1.0, 1.0]
    });
    let gone = left.elapsed().as_secs_f64();
    envoys.push(Envoy::start(&quota_bootstrap(&[replicas[1].grpc])));
    clients = envoys.iter().map(Envoy::client).collect();
    let after = drive(&mut clients, &[None; 3], USER, SECOND * 5);
    let recovery = one_a_second(&mut clients);
    let span = started.elapsed().as_secs_f64();
    let subscribed_after = replicas.each_ref().map(subscribed);

    println!(
        "join/leave: the stopped Envoy exited ({status}); both leavers' subscriptions gone \
         {gone:.2} s after; sluice_rlqs_buckets_subscribed {subscribed_before:?} before, \
         {subscribed_after:?} at the end"
    );
    for (phase, tallies) in [("before", &before), ("after", &after)] {
        let figures: Vec<String> = tallies
            .iter()
            .map(|t| format!("{}/{}", t.admitted, t.offered))
            .collect();
        println!("join/leave: {phase} the change, admitted/offered per Envoy {figures:?}");
    }
    assert_within_bound(
        "join and leave (5 Envoys over the run)",
        first + admitted(&before) + admitted(&after) + admitted(&recovery.all),
        span,
        5.0 * DATA_PLANE_SLACK,
    );
    println!("join/leave: then at 1/s per Envoy {recovery:?}");
    // 3/s asked of the rule's 5/s, yet the two Envoys on replica 1 were seen admitting 1 of
    // their last 5 (first at second 6) in 3 of 5 runs while A, alone on replica 0, admitted
    // every request: A's smoothed demand, halved per 5 s report from the hammer's hundreds a
    // second, still wants the whole rate, and its pool holds rate × (time since A's last
    // report) from the shared bucket. docs/rlqs.md, "Across replicas". Floor: not locked out.
    recovery.assert_not_denied("join/leave", 0.2);
    assert_eq!(subscribed_after, [1.0, 2.0], "A; B and the newcomer");
    envoys.iter_mut().for_each(assert_alive);
}

/// The shipped bootstrap's fallback once an assignment expired (deploy/envoy/envoy-rlqs.yaml):
/// a local token bucket of the rule's own limit, [`TIGHT_RULE`] here.
fn with_rule_fallback(mut bootstrap: sluice_harness::Bootstrap) -> sluice_harness::Bootstrap {
    bucket_settings(&mut bootstrap)["expired_assignment_behavior"] = json!({
        "expired_assignment_behavior_timeout": "600s",
        "fallback_rate_limit": {"token_bucket": {
            "max_tokens": 10, "tokens_per_fill": 5, "fill_interval": "1s"}}
    });
    bootstrap
}

/// Three Envoys whose RLQS cluster lists both replicas hammer for 4 s; the replica holding
/// most streams is SIGKILLed. Its Envoys' streams move to the survivor within Envoy's 5 s
/// report tick (twice that when the first pick is the dead replica again), every Envoy admits
/// again, none crashes, and the bound holds with the fallback each moved Envoy used meanwhile.
#[test]
fn a_killed_replica_s_envoys_reconnect_to_the_survivor() {
    let redis = RedisServer::start();
    let [mut r0, mut r1] = two_replicas(&redis);
    let both = [r0.grpc, r1.grpc];
    let mut envoys = [0, 1, 2].map(|_| Envoy::start(&with_rule_fallback(quota_bootstrap(&both))));
    let mut clients: Vec<HttpClient> = envoys.iter().map(Envoy::client).collect();
    let started = now();
    let first = subscribe(&mut clients);
    sluice_harness::wait_until("3 streams", Duration::from_secs(10), || {
        streams(&r0) + streams(&r1) == 3.0
    });
    let before = drive(&mut clients, &[None; 3], USER, Duration::from_secs(4));
    let (victim, survivor) = if streams(&r0) >= streams(&r1) {
        (&mut r0, &r1)
    } else {
        (&mut r1, &r0)
    };
    let moved = streams(victim);
    victim.kill();
    let killed = now();
    let mut during = vec![Tally::default(); 3];
    while streams(survivor) < 3.0 {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the streams did not reach the survivor in 20 s"
        );
        let slice = drive(&mut clients, &[None; 3], USER, Duration::from_millis(250));
        for (d, s) in during.iter_mut().zip(slice) {
            d.offered += s.offered;
            d.admitted += s.admitted;
        }
    }
    let reconnect = killed.elapsed().as_secs_f64();
    let after = drive(&mut clients, &[None; 3], USER, Duration::from_secs(4));
    let recovery = one_a_second(&mut clients);
    let span = started.elapsed().as_secs_f64();
    println!(
        "replica kill: {moved} stream(s) on the killed replica, all 3 on the survivor \
         {reconnect:.2} s after the kill; admitted per Envoy before {:?}, until reconnected \
         {:?}, after {:?}",
        before.iter().map(|t| t.admitted).collect::<Vec<_>>(),
        during.iter().map(|t| t.admitted).collect::<Vec<_>>(),
        after.iter().map(|t| t.admitted).collect::<Vec<_>>(),
    );
    // Each moved Envoy may spend its local fallback bucket (C + r per second) from its
    // assignment's expiry until the survivor assigns it again.
    let fallback = moved * (TIGHT_CAPACITY + TIGHT_RATE * reconnect);
    assert_within_bound(
        "replica SIGKILLed",
        first + admitted(&before) + admitted(&during) + admitted(&after) + admitted(&recovery.all),
        span,
        3.0 * DATA_PLANE_SLACK + fallback,
    );
    println!("replica kill: then at 1/s per Envoy {recovery:?}");
    // 3/s asked of the rule's 5/s: each Envoy at least 2 of its last 5 (see RECOVERY_SECONDS).
    recovery.assert_not_denied("replica kill", 0.4);
    assert_eq!(subscribed(survivor), 3.0, "the survivor serves all three");
    envoys.iter_mut().for_each(assert_alive);
}

/// The tight rule beside another, so the file stays a valid domain without it.
const RULE_AND_OTHER: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5, burst: 10}
  - key: other
    rate_limit: {unit: second, requests_per_unit: 5}
"#;

/// A reload (SIGHUP) that removes the user rule: sluice abandons the bucket, Envoy erases it,
/// re-subscribes with the next request and gets a standing ALLOW_ALL: nothing denied any more.
#[test]
fn a_reload_removing_the_rule_abandons_the_bucket_in_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, RULE_AND_OTHER).unwrap();
    let sluice = SluiceProcess::start_with_config(dir.path(), &["--watch-config", "false"]);
    let mut envoy = Envoy::start(&quota_bootstrap(&[sluice.grpc]));
    let mut client = envoy.client();
    get_all(&mut client, USER, 1);
    wait_for_assignment(&sluice);
    let enforced = drive(&mut [envoy.client()], &[None], USER, Duration::from_secs(2))[0];
    println!(
        "reload: under the rule {} of {} admitted",
        enforced.admitted, enforced.offered
    );
    assert!(enforced.admitted < enforced.offered, "the rule denies");

    let loads = || {
        let config: serde_json::Value =
            serde_json::from_str(&sluice.admin_get("/config").1).unwrap();
        config["loads"]["ok"].as_u64().expect("loads.ok")
    };
    let loaded = loads();
    let other_only = RULE_AND_OTHER.replace(
        "  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 10}\n",
        "",
    );
    assert_ne!(other_only, RULE_AND_OTHER);
    std::fs::write(&file, other_only).unwrap();
    sluice.signal(libc::SIGHUP);
    sluice_harness::wait_until("the reload", Duration::from_secs(10), || loads() > loaded);
    let reloaded = now();
    let allow_before = assignments_sent(&sluice, "allow_all");
    sluice_harness::wait_until("an abandon", Duration::from_secs(10), || {
        get_all(&mut client, USER, 1);
        assignments_sent(&sluice, "abandon") > 0.0
    });
    let abandoned = reloaded.elapsed().as_secs_f64();
    sluice_harness::wait_until("a standing ALLOW_ALL", Duration::from_secs(10), || {
        get_all(&mut client, USER, 1);
        assignments_sent(&sluice, "allow_all") > allow_before && subscribed(&sluice) == 1.0
    });
    let allowed = reloaded.elapsed().as_secs_f64();
    // Past one TTL and one of Envoy's 5 s reports: every request admitted.
    let free = drive(&mut [envoy.client()], &[None], USER, Duration::from_secs(7))[0];
    println!(
        "reload: abandon sent {abandoned:.2} s after the reload, ALLOW_ALL {allowed:.2} s; \
         then {} of {} admitted; abandons {}",
        free.admitted,
        free.offered,
        assignments_sent(&sluice, "abandon")
    );
    assert_eq!(assignments_sent(&sluice, "abandon"), 1.0);
    assert_eq!(free.admitted, free.offered, "no rule: nothing denied");
    assert!(
        free.offered > 100,
        "the load ran ({} requests)",
        free.offered
    );
    assert_alive(&mut envoy);
}

/// Three Envoys on two replicas hammer for 6 s until each is denied, then the load stops: once
/// the bucket refilled, every Envoy admits again, and a steady 1 request a second each (3/s
/// against the rule's 5/s) is admitted.
#[test]
fn no_envoy_stays_denied_after_the_bucket_refills() {
    let redis = RedisServer::start();
    let replicas = two_replicas(&redis);
    let mut envoys = [0, 1, 0].map(|r| Envoy::start(&quota_bootstrap(&[replicas[r].grpc])));
    let mut clients: Vec<HttpClient> = envoys.iter().map(Envoy::client).collect();
    subscribe(&mut clients);
    replicas.iter().for_each(wait_for_assignment);
    let hammered = drive(&mut clients, &[None; 3], USER, Duration::from_secs(6));
    for (i, t) in hammered.iter().enumerate() {
        assert!(t.admitted < t.offered, "Envoy {i} was never denied: {t:?}");
    }
    let recovery = one_a_second(&mut clients);
    println!(
        "refill: hammered (admitted/offered) {:?}; then {recovery:?}",
        hammered
            .iter()
            .map(|t| format!("{}/{}", t.admitted, t.offered))
            .collect::<Vec<_>>()
    );
    // 3/s asked of the rule's 5/s: each Envoy at least 2 of its last 5 (see RECOVERY_SECONDS).
    recovery.assert_not_denied("refill", 0.4);
    envoys.iter_mut().for_each(assert_alive);
}
