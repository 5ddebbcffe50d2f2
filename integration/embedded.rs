//! The engine embedded as a library (`engine/examples/embedded`): the example's own service,
//! built from plain option structs at their defaults, limits HTTP callers on memory, and two
//! replicas of it share one limit through one Redis.

#[path = "../engine/examples/embedded/service.rs"]
mod service;

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_engine::backend::Backend;
use sluice_engine::backend::memory::{MemoryBackend, MemoryOptions};
use sluice_engine::backend::redis::{RedisBackend, RedisOptions};
use sluice_engine::clock::MonotonicClock;
use sluice_harness::{HttpClient, HttpResponse, RedisServer};

/// Serves the example's router for `backend` on a free loopback port.
async fn replica<B: Backend>(backend: B) -> SocketAddr {
    let limiter = service::limiter(backend).expect("the example's rules load");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, service::router(limiter)).into_future());
    addr
}

fn hello(client: &mut HttpClient, key: &str) -> HttpResponse {
    tokio::task::block_in_place(|| client.get("/hello", &[("x-api-key", key.as_bytes())]))
}

fn remaining(response: &HttpResponse) -> Option<String> {
    response.one("x-ratelimit-remaining")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_limits_each_key_on_memory() {
    let memory = MemoryBackend::new(Arc::new(MonotonicClock::new()), MemoryOptions::default());
    let mut client = HttpClient::new(replica(Arc::new(memory)).await);
    for left in ["2", "1", "0"] {
        let response = hello(&mut client, "alice");
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(remaining(&response).as_deref(), Some(left));
    }
    let refused = hello(&mut client, "alice");
    assert_eq!(refused.status, 429, "the fourth in a minute: {refused:?}");
    let wait: u64 = refused.one("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "retry-after {wait}");
    assert_eq!(
        hello(&mut client, "bob").status,
        200,
        "another key has its own limit"
    );
    let anonymous = tokio::task::block_in_place(|| client.get("/hello", &[]));
    assert_eq!(anonymous.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_of_the_example_share_one_limit_in_redis() {
    let redis = RedisServer::start();
    let connect = || {
        RedisBackend::connect(RedisOptions {
            urls: vec![redis.url()],
            ..RedisOptions::default()
        })
    };
    let mut replicas = [
        HttpClient::new(replica(connect().await.unwrap()).await),
        HttpClient::new(replica(connect().await.unwrap()).await),
    ];
    let statuses: Vec<u16> = (0..5)
        .map(|i| hello(&mut replicas[i % 2], "carol").status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "3 a minute across both"
    );
    let keys = redis.cli(None, &["--scan", "--pattern", "sluice:*"]);
    assert!(
        keys.lines()
            .any(|k| k.contains("api_key") && k.contains("carol")),
        "the bucket lives in Redis under the default prefix: {keys:?}"
    );
}
