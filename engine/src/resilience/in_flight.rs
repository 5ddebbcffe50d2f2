//! A bound on decisions in progress. When Redis stalls, each call waits out its deadline; with
//! no bound a burst of traffic would pile up tasks and buffers without limit. Past the bound a
//! call is refused at once (RESOURCE_EXHAUSTED at the edge) instead of queueing.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts decisions in progress against a limit.
#[derive(Debug)]
pub struct InFlight {
    limit: usize,
    current: AtomicUsize,
}

/// One decision in progress; leaving (drop, also on cancellation) frees its place.
#[derive(Debug)]
pub struct InFlightGuard<'a>(&'a AtomicUsize);

impl InFlight {
    /// `limit` of 0 is treated as 1.
    pub fn new(limit: usize) -> Self {
        InFlight {
            limit: limit.max(1),
            current: AtomicUsize::new(0),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// A place, or `None` when `limit` decisions are already in progress.
    pub fn enter(&self) -> Option<InFlightGuard<'_>> {
        let taken = self
            .current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            });
        taken.ok().map(|_| InFlightGuard(&self.current))
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_limit_and_frees_on_drop() {
        let gate = InFlight::new(2);
        let a = gate.enter().unwrap();
        let b = gate.enter().unwrap();
        assert!(gate.enter().is_none());
        assert_eq!(gate.current(), 2);
        drop(a);
        let c = gate.enter().unwrap();
        assert!(gate.enter().is_none());
        drop((b, c));
        assert_eq!(gate.current(), 0);
        assert_eq!(InFlight::new(0).limit(), 1);
    }
}
