//! sluice — an Envoy external rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`).
//!
//! Every replica checks and updates one shared token bucket per client in Redis through one atomic
//! Lua script that refills against Redis's clock, so a limit means the same at 2 replicas or 200.
//! Without Redis it runs on an embedded in-memory backend with identical semantics.
//!
//! Crate map (pure core, thin edges):
//!
//! - [`rule`]: compiled rule types — units, rates, failure modes.
//! - [`request`]: a validated rate-limit request in plain Rust.
//! - [`compat`]: envoyproxy/ratelimit environment settings → sluice's own.
//! - [`config`]: YAML model, validation with file:line errors, loading a file or directory.
//! - [`descriptor`]: compiled descriptor tree; request entries → the rule they reach.
//! - [`explain`]: which rule a descriptor reaches (or why none), its bucket and storage key.
//! - [`key`]: the storage key of a bucket: injective, hash-tagged for Redis Cluster, tagged by
//!   algorithm.
//! - [`algorithm`]: pure arithmetic of the per-rule algorithms (token bucket, fixed window,
//!   sliding window, GCRA); time is an argument. `lua/limit.lua` mirrors it.
//! - [`clock`]: injected time, so tests step it.
//! - [`backend`]: the `Backend` trait; `memory` and `redis` implementations, the Redis
//!   endpoints' circuit breakers.
//! - [`lease`]: token leasing — a replica spends a batch of tokens taken in one script call.
//! - [`limiter`]: request → rules → one backend call → [`limiter::Decision`].
//! - [`resilience`]: when Redis is slow or gone — circuit breakers, the `local` policy's buckets,
//!   the over-limit cache, the in-flight bound, readiness rules.
//! - [`dynamic_metadata`]: envoyproxy/ratelimit's `RateLimitResponse.dynamic_metadata`.
//! - [`service`]: the gRPC entry point (`ShouldRateLimit`): protobuf in, decide, protobuf +
//!   headers out.
//! - [`validate`]: what a decoded request must be to be decided (bounds, fields), and which
//!   refusals a real Envoy can meet.
//! - [`quota`]: the Rate Limit Quota Service (RLQS, `StreamRateLimitQuotas`): prepaid
//!   assignments per data plane over the same rules and buckets.
//! - [`admin`]: HTTP admin — health, readiness, active config, metrics, `/explain`, `/buckets`.
//! - [`telemetry`]: metrics (OpenTelemetry SDK: Prometheus `/metrics`, OTLP push), traces
//!   (OTLP, W3C `traceparent`), logs (stderr, text or JSON).
//! - [`cli`]: the subcommands — `serve` (runtime, telemetry, server), `check-config`, `explain`,
//!   `bucket` (a client of `/buckets`).
//! - [`security`]: TLS/mTLS, caller policy, HTTP/2 limits, strict request decoding.
//! - [`settings`]: CLI flags and environment → [`settings::Settings`]; a leaf module.
//! - [`runtime`]: the tokio runtimes: one current-thread runtime per serving thread for `serve`.
//! - [`server`]: `run(settings, shutdown)` — wires the pieces and serves.
//! - [`xds`]: config pushed by an xDS management server (ADS), validated like files.

// The pure core, re-exported so `sluice::rule`, `crate::key`, ... name one module wherever used.
pub use sluice_core::{
    advertised, algorithm, clock, decision, descriptor, explain, holder, key, request, rule,
};

pub mod admin;
pub mod backend;
pub mod cli;
pub mod compat;
pub mod config;
pub mod limiter;
pub mod quota;
pub mod resilience;
pub mod rls;
pub mod runtime;
pub mod security;
pub mod server;
pub mod settings;
pub mod telemetry;
pub mod top;
pub mod value_text;
pub mod xds;
