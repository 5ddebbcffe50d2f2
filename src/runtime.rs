//! The tokio runtime `serve` runs on.
//!
//! - **The LIFO slot is off** (when built with `--cfg tokio_unstable`, which
//!   `.cargo/config.toml` sets). With it on, the HTTP/2 connection task a finished call wakes runs
//!   first and flushes that one response, so responses leave one `writev` each; with it off, the
//!   connection task queues behind the other finished calls and flushes them together. The effect
//!   on throughput is measured in docs/benchmarks.md.
//! - **Worker threads** are `--worker-threads` (default: the CPUs this process may use), so a
//!   deployment sharing its cores with Redis or a sidecar can choose fewer.
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
