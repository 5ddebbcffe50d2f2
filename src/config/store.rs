//! The active config and how a new one replaces it: whole sets only, last good one kept.
//!
//! File reloads and xDS pushes both end in [`ConfigStore::install`], so "an invalid set changes
//! nothing" holds whatever the source.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use super::{Config, ConfigErrors};

/// The outcome of the last attempt to install a config that failed, for `GET /config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// Where the rejected set came from (a path, `xds version 7`, …).
    pub source: String,
    pub errors: ConfigErrors,
}

/// Holds the active [`Config`] (read lock-free on the request path) and the reload history.
#[derive(Debug)]
pub struct ConfigStore {
    active: Arc<ArcSwap<Config>>,
    last_rejected: Mutex<Option<Rejected>>,
    loads_ok: AtomicU64,
    loads_failed: AtomicU64,
}

impl ConfigStore {
    pub fn new(initial: Config) -> Self {
        ConfigStore {
            active: Arc::new(ArcSwap::from_pointee(initial)),
            last_rejected: Mutex::new(None),
            loads_ok: AtomicU64::new(1),
            loads_failed: AtomicU64::new(0),
        }
    }

    /// The handle the limiter reads through.
    pub fn active(&self) -> &Arc<ArcSwap<Config>> {
        &self.active
    }

    /// Swaps in `result` when it is a valid set; otherwise keeps the active config and records
    /// why. Returns whether the new set became active.
    pub fn install(&self, result: Result<Config, ConfigErrors>, source: &str) -> bool {
        match result {
            Ok(config) => {
                let digest = config.digest().to_string();
                let previous = self.active.swap(Arc::new(config));
                self.loads_ok.fetch_add(1, Ordering::Relaxed);
                *self.lock() = None;
                if previous.digest() != digest {
                    tracing::info!(source, digest, "config activated");
                }
                true
            }
            Err(errors) => {
                self.loads_failed.fetch_add(1, Ordering::Relaxed);
                // One line per rejected set, whatever the log format: the errors joined by "; ".
                let joined = errors
                    .0
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::error!(
                    source,
                    count = errors.0.len(),
                    errors = %joined,
                    "config rejected; the last good config stays active"
                );
                *self.lock() = Some(Rejected {
                    source: source.to_string(),
                    errors,
                });
                false
            }
        }
    }

    /// The most recent rejection, cleared by the next successful install.
    pub fn last_rejected(&self) -> Option<Rejected> {
        self.lock().clone()
    }

    /// (successful, failed) load attempts since start; the initial load counts as successful.
    pub fn load_counts(&self) -> (u64, u64) {
        (
            self.loads_ok.load(Ordering::Relaxed),
            self.loads_failed.load(Ordering::Relaxed),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Rejected>> {
        self.last_rejected
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_sources;

    fn source(domain: &str, rpu: &str) -> Vec<(String, String)> {
        vec![(
            format!("{domain}.yaml"),
            format!(
                "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {rpu}}}\n"
            ),
        )]
    }

    #[test]
    fn invalid_set_keeps_the_last_good_config() {
        let store = ConfigStore::new(load_sources(&source("a", "5")).unwrap());
        let before = store.active().load().digest().to_string();
        assert!(!store.install(load_sources(&source("a", "-1")), "test"));
        assert_eq!(store.active().load().digest(), before);
        let rejected = store.last_rejected().expect("recorded");
        assert!(
            rejected.errors.to_string().contains("a.yaml:4:"),
            "{}",
            rejected.errors
        );
        assert_eq!(store.load_counts(), (1, 1));

        assert!(store.install(load_sources(&source("a", "7")), "test"));
        assert_ne!(store.active().load().digest(), before);
        assert!(store.last_rejected().is_none());
        assert_eq!(store.load_counts(), (2, 1));
    }
}
