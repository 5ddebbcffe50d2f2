//! The tokio runtime `serve` runs on.
//!
//! Two choices, both measured with `h2load -c 16 -m 32` on the 2-core benchmark machine
//! (README, Benchmarks):
//!
//! - **The LIFO slot is off** (when built with `--cfg tokio_unstable`, which
//!   `.cargo/config.toml` sets). With it on, a worker runs the task a finished call just woke
//!   before anything else: each finished call's stream task wakes its HTTP/2 connection task,
//!   which lands in the slot and flushes that one response, so responses leave one `writev`
//!   each (0.97 per call against the Redis backend, 0.38 against memory). With it off, the
//!   woken connection task queues behind the other finished calls and flushes them together
//!   (0.21 and 0.04 `writev` per call): the memory backend's peak rose from ~113k to ~145k
//!   calls/s, the Redis backend's from ~46k to ~49k.
//! - **Worker threads** are `--worker-threads` (default: the CPUs this process may use). Fewer
//!   workers mean fewer wake-ups across threads: before mimalloc and the script's one write per
//!   distinct key, one worker took the Redis backend from ~49k to ~63k calls/s on a machine
//!   shared with Redis and the load; since, two workers do as well or better (README,
//!   Benchmarks), so the default stays and the flag lets a deployment choose.
//!
//! `disable_lifo_slot` is an unstable tokio API: built without the cfg, sluice still works,
//! with tokio's default scheduling, and [`LIFO_SLOT_DISABLED`] says so in the start-up log.

use std::num::NonZeroUsize;

/// Whether this build turns tokio's LIFO slot off (see the module docs).
pub const LIFO_SLOT_DISABLED: bool = cfg!(tokio_unstable);

/// A multi-threaded runtime with I/O and timers, `worker_threads` workers (tokio's default, the
/// available parallelism, when `None`) and the LIFO slot off where the build allows.
pub fn build(worker_threads: Option<NonZeroUsize>) -> std::io::Result<tokio::runtime::Runtime> {
    build_with(worker_threads, true)
}

/// [`build`], with tokio's LIFO slot kept when `disable_lifo_slot` is false: the benchmarks'
/// reference row for a server on tokio's defaults.
pub fn build_with(
    worker_threads: Option<NonZeroUsize>,
    disable_lifo_slot: bool,
) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = worker_threads {
        builder.worker_threads(n.get());
    }
    #[cfg(tokio_unstable)]
    if disable_lifo_slot {
        builder.disable_lifo_slot();
    }
    #[cfg(not(tokio_unstable))]
    let _ = disable_lifo_slot;
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_tasks_on_the_requested_workers() {
        for workers in [1, 3] {
            let runtime = build(NonZeroUsize::new(workers)).expect("runtime");
            assert_eq!(runtime.metrics().num_workers(), workers);
            let answer = runtime.block_on(async {
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    tx.send(42).unwrap();
                });
                rx.await.unwrap()
            });
            assert_eq!(answer, 42);
        }
    }

    #[test]
    #[allow(
        clippy::assertions_on_constants,
        reason = "the constant is the build's cfg; this test fails the builds that drop it"
    )]
    fn the_repository_build_turns_the_lifo_slot_off() {
        // `.cargo/config.toml` sets `--cfg tokio_unstable`; a RUSTFLAGS override drops it and
        // with it the measured response coalescing, which this makes visible.
        assert!(LIFO_SLOT_DISABLED, "built without --cfg tokio_unstable");
    }
}
