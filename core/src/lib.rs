//! sluice-core — the pure part of sluice: what a rate-limit request means, not how it travels.
//!
//! No async runtime, no network, no Redis: every function here is a computation over its
//! arguments (time included), so it is tested by stepping values, and the service crate (`sluice`)
//! wraps it in gRPC, backends and telemetry.
//!
//! Crate map:
//!
//! - [`rule`]: compiled rule types — units, rates, failure modes, rule ids.
//! - [`request`]: a validated rate-limit request in plain Rust (no protobuf).
//! - [`descriptor`]: the compiled descriptor tree; request entries → the rule they reach.
//! - [`key`]: a bucket's storage key — injective, hash-tagged for Redis Cluster, tagged by algorithm.
//! - [`algorithm`]: the four algorithms' arithmetic (token bucket, fixed window, sliding window,
//!   GCRA) and in-flight caps' slots; time is an argument. `lua/limit.lua` mirrors it.
//! - [`clock`]: injected time, so tests step it.
//! - [`config`]: the YAML model, validation with `file:line:column` errors, loading a file or a
//!   directory into a compiled [`config::Config`].
//! - [`holder`]: the holder entry of an in-flight cap's descriptor, kept out of its key.
//! - [`explain`]: which rule a descriptor reaches (or why none), its bucket and storage key.
//! - [`decision`]: what a decision says — per-descriptor statuses and the overall code.
//! - [`advertised`]: a status as a client reads it (hits, not tokens; remaining ≤ limit).
//! - [`quota`]: RLQS — a replica's prepaid pool per bucket, the data planes' shares, Envoy's
//!   token-bucket strategies.

pub mod advertised;
pub mod algorithm;
pub mod clock;
pub mod config;
pub mod decision;
pub mod descriptor;
pub mod explain;
pub mod holder;
pub mod key;
pub mod quota;
pub mod request;
pub mod rule;
pub mod top;
