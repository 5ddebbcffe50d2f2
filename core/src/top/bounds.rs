//! What every summary set of one replica shares, so the replica's bounds hold whatever the
//! number of sets: the rules tracked and the counters held.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A replica's bounds on its top-keys summaries, shared by its sets (cloning shares them).
#[derive(Clone, Debug)]
pub struct TopBounds(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    max_rules: usize,
    /// Rule → how many sets track it. Taken only when a set starts or stops tracking a rule.
    rules: Mutex<HashMap<Arc<str>, usize>>,
    /// Counters not held by any summary.
    free_counters: AtomicUsize,
    max_counters: usize,
}

impl TopBounds {
    /// At most `max_rules` distinct rules tracked and `max_counters` counters held, every set
    /// together.
    pub fn new(max_rules: usize, max_counters: usize) -> Self {
        TopBounds(Arc::new(Shared {
            max_rules,
            rules: Mutex::new(HashMap::new()),
            free_counters: AtomicUsize::new(max_counters),
            max_counters,
        }))
    }

    /// Distinct rules tracked now.
    pub fn rules(&self) -> usize {
        self.lock().len()
    }

    /// Counters held now.
    pub fn counters(&self) -> usize {
        self.0.max_counters - self.0.free_counters.load(Ordering::Relaxed)
    }

    /// One more set tracks `rule`: true when it is tracked already or there is room for it.
    pub(super) fn admit_rule(&self, rule: &Arc<str>) -> bool {
        let mut rules = self.lock();
        if let Some(sets) = rules.get_mut(rule) {
            *sets += 1;
            return true;
        }
        if rules.len() >= self.0.max_rules {
            return false;
        }
        rules.insert(rule.clone(), 1);
        true
    }

    /// One set stopped tracking `rule`.
    pub(super) fn release_rule(&self, rule: &str) {
        let mut rules = self.lock();
        if let Some(sets) = rules.get_mut(rule) {
            *sets -= 1;
            if *sets == 0 {
                rules.remove(rule);
            }
        }
    }

    /// Takes one counter: false when every counter is held.
    pub(super) fn take_counter(&self) -> bool {
        self.0
            .free_counters
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |free| {
                free.checked_sub(1)
            })
            .is_ok()
    }

    pub(super) fn give_counters(&self, n: usize) {
        self.0.free_counters.fetch_add(n, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, usize>> {
        self.0.rules.lock().unwrap_or_else(|e| e.into_inner())
    }
}
