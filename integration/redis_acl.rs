//! The least-privilege Redis ACL documented in docs/security.md, checked against a real
//! redis-server started on a free loopback port: the Redis backend works with exactly those
//! permissions, and the same user can touch nothing outside the key prefix.

use std::time::Duration;

use sluice::algorithm::BucketParams;
use sluice::backend::redis::{RedisBackend, RedisOptions};
use sluice::backend::{Backend, Hit};
use sluice_harness::RedisServer;

/// The ACL rule of docs/security.md, for user `sluice` and key prefix `sluice:`.
const ACL_RULE: &str = "on >s3cret-test-password resetkeys ~sluice:* resetchannels -@all \
     +evalsha +eval +script|load +time +hmget +hset +pexpire +ping \
     +zadd +zremrangebyscore +zcard";

/// The password of every ACL user this test creates (also in `ACL_RULE`).
const PASSWORD: &str = "s3cret-test-password";

const TEN: BucketParams = BucketParams {
    capacity: 10,
    requests_per_unit: 10,
    unit_ms: 1_000,
};

async fn connect(url: String) -> Result<RedisBackend, sluice::backend::BackendError> {
    RedisBackend::connect(RedisOptions {
        urls: vec![url],
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    })
    .await
}

#[tokio::test]
async fn least_privilege_acl_is_enough_and_confines_the_user_to_its_prefix() {
    let redis = RedisServer::start();
    set_user(&redis, "sluice", ACL_RULE.split_whitespace());

    let backend = connect(redis.url_for("sluice", PASSWORD))
        .await
        .expect("connects and loads the script");
    backend.probe().await.expect("probe");
    let hits = [
        Hit::new("sluice:{edge|tenant=acme}", TEN, 4),
        Hit::new("sluice:{edge|tenant=acme}|route=export", TEN, 1),
    ];
    let verdicts = backend.check(&hits).await.expect("check");
    assert!(verdicts.iter().all(|v| v.allowed));
    // The replica heartbeat (`lua/heartbeat.lua`) works with the same rule.
    let live = backend
        .heartbeat("sluice:replicas", "acl-test", Duration::from_secs(5))
        .await
        .expect("heartbeat");
    assert_eq!(live, 1);
    assert_eq!(verdicts[0].remaining, 6);
    assert_eq!(backend.check(&hits).await.unwrap()[0].remaining, 2);
    // Foreign data under a bucket's key or the heartbeat's is repaired with these commands
    // (PEXPIRE 0 deletes; no DEL needed).
    for key in ["sluice:{edge|tenant=spoilt}", "sluice:replicas"] {
        assert_eq!(redis.cli(None, &["SET", key, "foreign"]).trim(), "OK");
    }
    let spoilt = [Hit::new("sluice:{edge|tenant=spoilt}", TEN, 1)];
    assert_eq!(
        backend.check(&spoilt).await.expect("repaired")[0].remaining,
        9
    );
    let live = backend
        .heartbeat("sluice:replicas", "acl-test", Duration::from_secs(5))
        .await
        .expect("heartbeat repaired");
    assert_eq!(live, 1);

    // The admin listener's peek (the script's read-only mode) and reset work with the same
    // rule; the key's TTL needs `+pttl`, without it the peek reports none.
    let peeked = backend.peek(&hits[..1]).await.remove(0).expect("peek");
    assert_eq!((peeked.peek.verdict.remaining, peeked.ttl_ms), (2, None));
    set_user(
        &redis,
        "sluice-pttl",
        ACL_RULE.split_whitespace().chain(["+pttl"]),
    );
    let with_pttl = connect(redis.url_for("sluice-pttl", PASSWORD))
        .await
        .unwrap();
    let peeked = with_pttl.peek(&hits[..1]).await.remove(0).expect("peek");
    assert!(peeked.ttl_ms.is_some_and(|ttl| ttl > 0), "{peeked:?}");
    assert_eq!(backend.reset(&hits[..1]).await, [Ok(true)]);
    assert_eq!(backend.check(&hits[..1]).await.unwrap()[0].remaining, 6);

    assert_confined_to_the_prefix(&redis, &backend).await;
    assert_every_command_is_needed(&redis, &hits).await;
}

/// `ACL SETUSER user rules…`, as the default user.
fn set_user<'a>(redis: &RedisServer, user: &'a str, rules: impl Iterator<Item = &'a str>) {
    let mut setuser = vec!["ACL", "SETUSER", user];
    setuser.extend(rules);
    assert_eq!(redis.cli(None, &setuser).trim(), "OK");
}

/// The script may not touch a key outside the prefix, and the user can run nothing else.
async fn assert_confined_to_the_prefix(redis: &RedisServer, backend: &RedisBackend) {
    let outside = [Hit::new("other:{edge|tenant=acme}", TEN, 1)];
    assert!(backend.check(&outside).await.is_err());
    for command in [
        &["GET", "sluice:{edge|tenant=acme}"][..],
        &["DEL", "sluice:{edge|tenant=acme}"],
        &["KEYS", "*"],
        &["FLUSHALL"],
        &["CONFIG", "GET", "*"],
        &["SCRIPT", "FLUSH"],
        &["ACL", "LIST"],
    ] {
        let reply = redis.cli(Some(("sluice", PASSWORD)), command);
        assert!(reply.contains("NOPERM"), "{command:?} answered {reply}");
    }
}

/// Without the script's own commands the user cannot decide, and without the heartbeat's it
/// cannot beat: the ACL is also minimal in that respect (each of these is needed).
async fn assert_every_command_is_needed(redis: &RedisServer, hits: &[Hit]) {
    for missing in ["+hset", "+hmget", "+pexpire", "+time"] {
        let user = format!("sluice{}", &missing[1..]);
        set_user(
            redis,
            &user,
            ACL_RULE.split_whitespace().filter(|r| *r != missing),
        );
        let result = match connect(redis.url_for(&user, PASSWORD)).await {
            Ok(b) => b.check(hits).await.map(|_| ()),
            Err(e) => Err(e),
        };
        assert!(result.is_err(), "works without {missing}");
    }
    for missing in ["+zadd", "+zremrangebyscore", "+zcard"] {
        let user = format!("sluice{}", &missing[1..]);
        set_user(
            redis,
            &user,
            ACL_RULE.split_whitespace().filter(|r| *r != missing),
        );
        let b = connect(redis.url_for(&user, PASSWORD))
            .await
            .expect("decisions need no heartbeat command");
        let beat = b
            .heartbeat("sluice:replicas", "acl-test", Duration::from_secs(5))
            .await;
        assert!(beat.is_err(), "heartbeat works without {missing}");
    }
}
