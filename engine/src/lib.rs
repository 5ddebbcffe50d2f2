//! sluice's limiting engine, usable without the service around it: build a [`limiter::Limiter`]
//! over a [`backend::Backend`] (the in-memory [`backend::memory::MemoryBackend`] or
//! [`backend::redis::RedisBackend`]) and a checked [`config::Config`], and ask it to
//! [`decide`](limiter::Limiter::decide) a [`request::RateLimitRequest`].
//!
//! Every option struct owns its defaults (`Default`, and the `DEFAULT_*` constants the service's
//! command line shows), so embedding needs no flags: `engine/examples/embedded.rs` is a small HTTP
//! service that limits its own callers with it.
//!
//! - [`backend`]: the `Backend` trait, its memory and Redis implementations, the Redis endpoints'
//!   circuit breakers, the per-second split.
//! - [`limiter`]: request → rules → one backend call → [`decision::Decision`]; token leases.
//! - [`resilience`]: when the backend is slow or gone — the `local` policy's buckets, the
//!   over-limit cache, the in-flight bound, degraded notices.
//!
//! The pure rules, keys, algorithms and config model come from [`sluice_core`], re-exported so
//! one path names each module.

pub use sluice_core::{
    advertised, algorithm, clock, config, decision, descriptor, explain, holder, key, request, rule,
};

pub mod backend;
pub mod limiter;
pub mod resilience;
