//! The tokio runtimes sluice runs on.
//!
//! - **`sluice serve`: one current-thread runtime per serving thread** ([`current_thread`], the
//!   count from [`serving_threads`]): the main thread's, and one more thread per further CPU,
//!   each running its own copy of the gRPC server over the connections handed to it
//!   (`crate::server`'s serving threads). A connection and every call on it stay on one thread,
//!   so a call wakes no other thread: on a multi-threaded runtime, hyper's task per HTTP/2 stream
//!   made tokio unpark a second worker for almost every call when calls arrive one or a few at a
//!   time, as Envoy makes them on its one connection (~0.7 context switches per request).
//!   A current-thread runtime also runs a woken connection task after the calls already queued,
//!   so responses that finish together leave in one write per connection.
//! - **[`build_with`]: a multi-threaded runtime**, for the load generator and the no-op
//!   reference servers of the benchmarks: tokio's defaults, or the LIFO slot off (when built
//!   with `--cfg tokio_unstable`, which `.cargo/config.toml` sets; [`LIFO_SLOT_DISABLED`] says
//!   whether the build can). With the LIFO slot on, the connection task a finished call wakes
//!   runs first and flushes that one response; off, it queues behind the other finished calls.

use std::num::NonZeroUsize;

/// Whether this build can turn tokio's LIFO slot off in [`build_with`].
pub const LIFO_SLOT_DISABLED: bool = cfg!(tokio_unstable);

/// A current-thread runtime with I/O and timers: one serving thread's.
pub fn current_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Serving threads for `--worker-threads` (`requested`); when `None`, one per CPU this process
/// may use (cgroup quota and affinity included), at least one.
pub fn serving_threads(requested: Option<NonZeroUsize>) -> usize {
    requested
        .or_else(|| std::thread::available_parallelism().ok())
        .map_or(1, NonZeroUsize::get)
}

/// A multi-threaded runtime with I/O and timers, `worker_threads` workers (tokio's default, the
/// available parallelism, when `None`), with tokio's LIFO slot off when `disable_lifo_slot` and
/// the build allows.
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
            let runtime = build_with(NonZeroUsize::new(workers), true).expect("runtime");
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
    fn a_serving_runtime_is_one_thread_with_timers() {
        let runtime = current_thread().expect("runtime");
        assert_eq!(runtime.metrics().num_workers(), 1);
        let caller = std::thread::current().id();
        let ran_on = runtime.block_on(async {
            tokio::spawn(async {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                std::thread::current().id()
            })
            .await
            .unwrap()
        });
        assert_eq!(
            ran_on, caller,
            "a spawned task runs on the serving thread itself"
        );
    }

    #[test]
    fn serving_threads_follow_the_flag_else_the_cpus() {
        assert_eq!(serving_threads(NonZeroUsize::new(3)), 3);
        let cpus = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert_eq!(serving_threads(None), cpus);
    }

    #[test]
    #[allow(
        clippy::assertions_on_constants,
        reason = "the constant is the build's cfg; this test fails the builds that drop it"
    )]
    fn the_repository_build_can_turn_the_lifo_slot_off() {
        // `.cargo/config.toml` sets `--cfg tokio_unstable`; a RUSTFLAGS override drops it and
        // with it the benchmarks' LIFO-off reference runtime, which this makes visible.
        assert!(LIFO_SLOT_DISABLED, "built without --cfg tokio_unstable");
    }
}
