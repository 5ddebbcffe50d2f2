//! The Redis backend and the servers it meets: a stalled one (timeouts), a gone one (the probe),
//! ACL credentials in the URL, Cluster slot routing and MOVED, Sentinel failover.

use std::collections::HashSet;
use std::time::Duration;

use sluice::algorithm::{Algorithm, BucketParams};
use sluice::backend::redis::{RedisBackend, RedisMode, RedisOptions};
use sluice::backend::{Backend, BackendError, Hit};
use sluice::key::{RuleTag, bucket_key};
use sluice::request::Entry;

use sluice_harness::{RedisCluster, RedisSentinel, RedisServer, command_calls, wait_until};

use super::{
    ONE_PER_MINUTE, RECOVERY, ROOMY, check_until_ok, key, options, reset_stats, standalone,
};

#[tokio::test]
async fn stalled_server_gives_timeout_then_recovers() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(RedisOptions {
        command_timeout: Duration::from_millis(100),
        ..options(vec![server.url()], RedisMode::Standalone)
    })
    .await
    .expect("connect");
    let hit = [Hit::new(key("stall", "a"), ROOMY, 1)];
    // A busy CI machine may take longer than the tight bound once; the stall below cannot pass.
    check_until_ok(&backend, &hit).await;

    server.pause();
    let stalled = backend.check(&hit).await;
    let probe = backend.probe().await;
    server.resume();
    assert_eq!(stalled, Err(BackendError::Timeout(100)));
    assert_eq!(probe, Err(BackendError::Timeout(100)));
    check_until_ok(&backend, &hit).await;
}

#[tokio::test]
async fn probe_runs_the_script_and_fails_when_redis_is_gone() {
    let mut server = RedisServer::start();
    let backend = standalone(&server).await;
    reset_stats(&server);
    backend.probe().await.expect("probe");
    assert_eq!(command_calls(&server, "evalsha"), 1);
    server.kill();
    let err = backend.probe().await.expect_err("probe with Redis gone");
    assert!(
        matches!(err, BackendError::Unavailable(_) | BackendError::Timeout(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn acl_user_and_password_from_the_url() {
    let server =
        RedisServer::start_with(&["--user", "sluice", "on", ">s3cret", "~*", "&*", "+@all"]);
    let url = |password: &str| format!("redis://sluice:{password}@127.0.0.1:{}", server.port());
    let backend = RedisBackend::connect(options(vec![url("s3cret")], RedisMode::Standalone))
        .await
        .expect("connect as the ACL user");
    backend
        .check(&[Hit::new(key("acl", "a"), ROOMY, 1)])
        .await
        .expect("check");
    let err = RedisBackend::connect(RedisOptions {
        connect_timeout: Duration::from_millis(500),
        ..options(vec![url("xyzzy-guess")], RedisMode::Standalone)
    })
    .await
    .expect_err("a wrong password must not connect");
    assert!(
        !err.to_string().contains("xyzzy"),
        "password leaked into {err}"
    );
    // Said as such at once, not left to time out.
    assert!(matches!(err, BackendError::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn cluster_one_call_per_slot_in_hit_order_and_follows_moved() {
    let cluster = RedisCluster::start(3, 0);
    let backend = RedisBackend::connect(options(cluster.urls(), RedisMode::Cluster))
        .await
        .expect("connect");

    assert_script_cached_on_every_master(&cluster);
    let same_tag = keys_sharing_a_slot(&cluster);
    let tags = tags_on_three_masters(&cluster);
    // Distinct capacities tell the verdicts apart; the slow refill keeps state visible.
    let capacity = |n: u64| BucketParams {
        capacity: n,
        ..ONE_PER_MINUTE
    };
    // Interleaved so the grouping by slot has to put verdicts back in order.
    let hits = [
        Hit::new(key(&tags[0], "a"), capacity(11), 1),
        Hit::new(key(&tags[1], "a"), capacity(12), 1),
        Hit::new(key(&tags[0], "b"), capacity(13), 1),
        Hit::new(key(&tags[2], "a"), capacity(14), 1),
        Hit::new(same_tag[0].clone(), capacity(15), 1),
        Hit::new(same_tag[1].clone(), capacity(16), 1),
    ];
    let distinct_slots: HashSet<u16> = hits.iter().map(|hit| cluster.keyslot(&hit.key)).collect();
    cluster.masters().into_iter().for_each(reset_stats);
    let verdicts = backend.check(&hits).await.expect("check");
    let remaining: Vec<u64> = verdicts.iter().map(|v| v.remaining).collect();
    assert_eq!(remaining, [10, 11, 12, 13, 14, 15]);
    let evalsha = evalsha_calls(&cluster);
    println!(
        "cluster: {} slots in one check, {evalsha} EVALSHA",
        distinct_slots.len()
    );
    assert_eq!(evalsha, distinct_slots.len() as u64);

    // One slot, one call.
    cluster.masters().into_iter().for_each(reset_stats);
    let same_slot = [
        Hit::new(same_tag[0].clone(), capacity(15), 1),
        Hit::new(same_tag[1].clone(), capacity(16), 1),
    ];
    backend.check(&same_slot).await.expect("check");
    let evalsha = evalsha_calls(&cluster);
    assert_eq!(evalsha, 1);

    // Move that slot (with its keys) to another master: the stale slot map meets MOVED.
    let slot = cluster.keyslot(&same_tag[0]);
    let owner = cluster.master_for_slot(slot).port();
    let target = cluster
        .masters()
        .into_iter()
        .find(|m| m.port() != owner)
        .expect("another master");
    cluster.move_slot(slot, target);
    let verdicts = backend.check(&same_slot).await.expect("check after MOVED");
    let remaining: Vec<u64> = verdicts.iter().map(|v| v.remaining).collect();
    assert_eq!(remaining, [12, 13], "state moved with the slot");
    assert!(command_calls(target, "evalsha") >= 1);
}

/// The script was loaded on every master.
fn assert_script_cached_on_every_master(cluster: &RedisCluster) {
    let sha = sha1_smol::Sha1::from(include_str!("../../lua/limit.lua"))
        .digest()
        .to_string();
    for master in cluster.masters() {
        let exists: Vec<i64> = master.cmd(&["SCRIPT", "EXISTS", &sha]);
        assert_eq!(exists, [1], "script cached on {}", master.addr());
    }
}

/// Two bucket keys whose descriptors share domain and first entry: they share a hash tag,
/// hence a slot (which `sluice::key::slot` computes as Redis does).
fn keys_sharing_a_slot(cluster: &RedisCluster) -> Vec<String> {
    let tenant = Entry::new("tenant", "acme");
    let same_tag: Vec<String> = [
        vec![tenant.clone()],
        vec![tenant.clone(), Entry::new("route", "export")],
    ]
    .iter()
    .map(|entries| {
        bucket_key(
            "sluice:",
            "api",
            entries,
            RuleTag::Configured,
            Algorithm::TokenBucket,
        )
    })
    .collect();
    let slots: HashSet<u16> = same_tag.iter().map(|key| cluster.keyslot(key)).collect();
    assert_eq!(slots.len(), 1, "{same_tag:?}");
    assert_eq!(
        sluice::key::slot(&same_tag[0]),
        cluster.keyslot(&same_tag[0])
    );
    same_tag
}

/// Three hash tags on three different masters.
fn tags_on_three_masters(cluster: &RedisCluster) -> Vec<String> {
    let mut by_master = std::collections::HashMap::new();
    for n in 0.. {
        let tag = format!("t{n}");
        by_master
            .entry(cluster.master_for(&key(&tag, "x")).port())
            .or_insert(tag);
        if by_master.len() == 3 {
            break;
        }
    }
    by_master.into_values().collect()
}

/// EVALSHA calls across the masters since their stats were reset.
fn evalsha_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .masters()
        .into_iter()
        .map(|m| command_calls(m, "evalsha"))
        .sum()
}

#[tokio::test]
async fn sentinel_checks_go_to_the_master_and_follow_a_failover() {
    let mut sentinel = RedisSentinel::start();
    let backend = RedisBackend::connect(RedisOptions {
        sentinel_master: Some(sentinel.master_name().into()),
        ..options(sentinel.sentinel_urls(), RedisMode::Sentinel)
    })
    .await
    .expect("connect through the sentinels");
    let hit = [Hit::new(key("sentinel", "a"), ONE_PER_MINUTE, 1)];
    assert_eq!(backend.check(&hit).await.expect("check")[0].remaining, 9);
    let old = sentinel.master().port();
    assert_eq!(command_calls(sentinel.master(), "evalsha"), 1);
    backend.probe().await.expect("probe");
    // Concurrent checks share one call on the master, as on a standalone server.
    let concurrent = |tag: &'static str| -> Vec<Vec<Hit>> {
        (0..4)
            .map(|n| vec![Hit::new(key(tag, &format!("c{n}")), ONE_PER_MINUTE, 1)])
            .collect()
    };
    let shares_one_call = async |master: &RedisServer, requests: &[Vec<Hit>]| {
        reset_stats(master);
        let answers =
            futures::future::join_all(requests.iter().map(|hits| backend.check(hits))).await;
        assert!(
            answers
                .iter()
                .all(|a| a.as_ref().expect("check")[0].remaining == 9)
        );
        assert_eq!(command_calls(master, "evalsha"), 1, "{requests:?}");
    };
    shares_one_call(sentinel.master(), &concurrent("sentinel-before")).await;

    // Let the replica catch up, so the promoted one holds the bucket.
    let offset = |node: &RedisServer| node.info("replication").get("master_repl_offset").cloned();
    wait_until("replica caught up", RECOVERY, || {
        offset(&sentinel.nodes()[0]) == offset(&sentinel.nodes()[1])
    });

    // The master dies: checks fail until the sentinels promote the replica, then reach it.
    let old_index = sentinel
        .nodes()
        .iter()
        .position(|n| n.port() == old)
        .expect("ours");
    sentinel.node_mut(old_index).kill();
    let verdicts = check_until_ok(&backend, &hit).await;
    assert_eq!(
        verdicts[0].remaining, 8,
        "the promoted replica carries on with the bucket"
    );
    let new_master = sentinel.master();
    assert_ne!(new_master.port(), old);
    assert!(command_calls(new_master, "evalsha") + command_calls(new_master, "eval") >= 1);
    // The new master has its own batch queue.
    shares_one_call(new_master, &concurrent("sentinel-after")).await;
}
