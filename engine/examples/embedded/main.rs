//! sluice's engine embedded in a small HTTP service, without the sluice server: the service
//! limits its own callers, on the in-memory backend or, with `--redis`, on Redis, where every
//! replica of the service shares one limit.
//!
//! ```text
//! cargo run -p sluice-engine --example embedded -- 127.0.0.1:3000
//! cargo run -p sluice-engine --example embedded -- 127.0.0.1:3000 --redis redis://127.0.0.1:6379
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/hello
//! ```

mod service;

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::backend::Backend;
use sluice_engine::backend::memory::{MemoryBackend, MemoryOptions};
use sluice_engine::backend::redis::{RedisBackend, RedisOptions};
use sluice_engine::clock::MonotonicClock;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args.first().map_or("127.0.0.1:3000", String::as_str);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}/hello", listener.local_addr()?);
    match args.iter().position(|a| a == "--redis") {
        Some(i) => {
            let url = args.get(i + 1).ok_or("--redis needs a URL")?;
            // Every other option (deadline, breaker, batching) at its default.
            let options = RedisOptions {
                urls: vec![url.clone()],
                ..RedisOptions::default()
            };
            serve(listener, RedisBackend::connect(options).await?).await
        }
        None => {
            let memory = Arc::new(MemoryBackend::new(
                Arc::new(MonotonicClock::new()),
                MemoryOptions::default(),
            ));
            // Drops buckets that are full again, so memory follows the active keys.
            let _sweeper = memory.spawn_sweeper(Duration::from_secs(1));
            serve(listener, memory).await
        }
    }
}

async fn serve<B: Backend>(
    listener: tokio::net::TcpListener,
    backend: B,
) -> Result<(), Box<dyn std::error::Error>> {
    let limiter = service::limiter(backend)?;
    axum::serve(listener, service::router(limiter)).await?;
    Ok(())
}
