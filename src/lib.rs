//! sluice — an Envoy external rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`).
//!
//! Every replica checks and updates one shared token bucket per client in Redis through one atomic
//! Lua script that refills against Redis's clock, so a limit means the same at 2 replicas or 200.
//! Without Redis it runs on an embedded in-memory backend with identical semantics.
//!
//! Three floors: `sluice-core` (pure: rules, keys, algorithms, the config model), `sluice-engine`
//! (the limiting engine as a library: backends, limiter, leases, resilience; its options own
//! their defaults) and this crate, the edges around them. Both lower crates are re-exported so
//! `crate::limiter`, `crate::key`, ... name one module wherever used.
//!
//! From the core: [`rule`], [`request`], [`descriptor`], [`key`], [`algorithm`], [`clock`],
//! [`decision`], [`explain`], and the config model under [`config`].
//! From the engine: [`backend`] (memory, Redis, breakers, the per-second split), [`limiter`]
//! (request → buckets → one backend call → decision; token leases) and [`resilience`].
//!
//! The edges, one folder each:
//!
//! - [`rls`]: `ShouldRateLimit` — its codec, request validation, caller policy, headers and
//!   dynamic metadata.
//! - [`quota`]: the Rate Limit Quota Service (RLQS, `StreamRateLimitQuotas`) over the same rules
//!   and buckets.
//! - [`admin`]: HTTP admin — health, readiness, active config, metrics, `/explain`, `/buckets`,
//!   `/top`.
//! - [`xds`]: config pushed by an xDS management server (ADS), validated like files.
//! - [`config`]: the active config store and file reloads (beside the core's model).
//! - [`cli`] and [`settings`]: the subcommands, and flags/environment → [`settings::Settings`] →
//!   the engine's option structs (`settings/options.rs`); the only modules that know clap.
//! - [`compat`]: envoyproxy/ratelimit environment settings → sluice's own.
//! - [`server`] and [`runtime`]: wiring and serving threads; [`security`]: TLS/mTLS, HTTP/2
//!   limits, connection caps; [`telemetry`]: metrics, traces, logs; [`top`]: top-keys summaries.

pub use sluice_core::{
    advertised, algorithm, clock, decision, descriptor, explain, holder, key, request, rule,
};
// The engine, re-exported the same way: `crate::limiter`, `crate::backend`, `crate::resilience`.
pub use sluice_engine::{backend, limiter, resilience};

pub mod admin;
pub mod cli;
pub mod compat;
pub mod config;
pub mod quota;
pub mod rls;
pub mod runtime;
pub mod security;
pub mod server;
pub mod settings;
pub mod telemetry;
pub mod top;
pub mod value_text;
pub mod xds;
