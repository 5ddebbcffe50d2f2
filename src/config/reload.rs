//! Hot reload: watch the config path, re-read the whole set off the request path, install it
//! through [`ConfigStore::install`] (all or nothing; the last good set stays on error).
//!
//! What is watched: the config directory itself (or, for a single file, its directory), plus the
//! parent directory of the config path and of every symlink on the way to it. Any change there
//! re-reads the whole set, which covers
//! - editing, creating, deleting or renaming files in the directory;
//! - a Kubernetes ConfigMap update: the kubelet writes a new `..<timestamp>` directory and
//!   atomically renames a `..data` symlink to it, so the visible files change all at once;
//! - a symlink anywhere on the path being swapped (envoyproxy/ratelimit's `RUNTIME_ROOT`
//!   pointing at a new version): the watch set is recomputed after every reload, so the new
//!   target is watched from then on.
//!
//! Events are debounced (a multi-file update is read once) and reads (`open`, `access`) are
//! ignored, so loading the files does not trigger another load. `SIGHUP` reloads too, whether or
//! not the watcher runs. One reload runs at a time; changes during it cause one more.
//!
//! Bucket state across a reload: a bucket's key is its domain and descriptor entries (see
//! [`crate::key`]), not its rate, so a rule that keeps its place keeps its bucket when its rate
//! or burst changes. For a token bucket that is the right answer: the stored tokens are clamped
//! to the new capacity at the next refill and refill continues at the new rate, so a client
//! neither gets a fresh burst from an edit nor loses what it had earned. A rule that moves to a
//! different descriptor path has a different key anyway and starts full.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use notify_debouncer_full::notify::{Event, EventKind, RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::{ConfigErrors, ConfigStore, Diagnostic, LoadOptions, load_path_with};

/// How the config is reloaded.
#[derive(Clone, Debug)]
pub struct ReloadOptions {
    /// Watch the files; when false only `SIGHUP` (and [`Reloader::reload_now`]) reload.
    pub watch: bool,
    /// Quiet time after the last change before reading.
    pub debounce: Duration,
    /// The options the initial load used.
    pub load: LoadOptions,
}

/// A running reloader. Dropping it stops watching and listening for `SIGHUP`.
pub struct Reloader {
    trigger: Arc<Trigger>,
    tasks: Vec<JoinHandle<()>>,
}

impl Reloader {
    /// Asks for a reload, as a file change or `SIGHUP` would (for embedders and tests).
    pub fn reload_now(&self) {
        self.trigger.fire(Cause::Request);
    }
}

impl Drop for Reloader {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts reloading `path` into `store`. Must be called inside a Tokio runtime. Never fails: a
/// watcher that cannot start is logged and reloads then come from `SIGHUP` only.
pub fn spawn_reloader(path: PathBuf, store: Arc<ConfigStore>, options: ReloadOptions) -> Reloader {
    let trigger = Arc::new(Trigger::default());
    let mut tasks = Vec::new();
    #[cfg(unix)]
    if let Some(task) = listen_for_sighup(trigger.clone()) {
        tasks.push(task);
    }
    let watcher = if options.watch {
        match FileWatch::start(&path, trigger.clone(), options.debounce) {
            Ok(watch) => Some(watch),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot watch the config; reload with SIGHUP");
                None
            }
        }
    } else {
        None
    };
    tasks.push(tokio::spawn(reload_loop(
        path,
        store,
        options.load,
        trigger.clone(),
        watcher,
    )));
    Reloader { trigger, tasks }
}

/// [`spawn_reloader`] for a server: reloads until `stop` turns true or its sender is dropped.
pub fn spawn_until_stopped(
    path: PathBuf,
    store: Arc<ConfigStore>,
    options: ReloadOptions,
    mut stop: watch::Receiver<bool>,
) {
    let reloader = spawn_reloader(path, store, options);
    tokio::spawn(async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
        drop(reloader);
    });
}

async fn reload_loop(
    path: PathBuf,
    store: Arc<ConfigStore>,
    load: LoadOptions,
    trigger: Arc<Trigger>,
    mut watcher: Option<FileWatch>,
) {
    loop {
        trigger.notify.notified().await;
        let source = format!("{} ({})", path.display(), trigger.take_causes());
        // Watch what the path means now (a symlink may have moved) before reading it, so a
        // change made after the read is seen.
        if let Some(watcher) = &mut watcher {
            watcher.refresh(&path);
        }
        let (read_path, read_options) = (path.clone(), load.clone());
        // Parsing and validating a large set takes milliseconds: keep it off the runtime's workers.
        let result =
            match tokio::task::spawn_blocking(move || load_path_with(&read_path, &read_options))
                .await
            {
                Ok(result) => result,
                Err(e) => Err(ConfigErrors(vec![Diagnostic {
                    file: path.display().to_string(),
                    line: 0,
                    column: 0,
                    message: format!("config loader failed: {e}"),
                }])),
            };
        let before = store.active().load().digest().to_owned();
        if store.install(result, &source) {
            let active = store.active().load();
            if active.digest() != before {
                for warning in active.warnings() {
                    tracing::warn!(%warning, "config warning");
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Cause {
    FileChange,
    Signal,
    Request,
}

/// Reload requests, coalesced: any number of them while a reload runs cause one more.
#[derive(Default)]
struct Trigger {
    notify: Notify,
    file_change: AtomicBool,
    signal: AtomicBool,
    request: AtomicBool,
}

impl Trigger {
    fn fire(&self, cause: Cause) {
        let flag = match cause {
            Cause::FileChange => &self.file_change,
            Cause::Signal => &self.signal,
            Cause::Request => &self.request,
        };
        flag.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// What asked for the reload about to run, for the log and `GET /config`.
    fn take_causes(&self) -> String {
        let causes: Vec<&str> = [
            (&self.file_change, "file change"),
            (&self.signal, "SIGHUP"),
            (&self.request, "reload request"),
        ]
        .into_iter()
        .filter(|(flag, _)| flag.swap(false, Ordering::SeqCst))
        .map(|(_, name)| name)
        .collect();
        if causes.is_empty() {
            "reload".to_owned()
        } else {
            causes.join(", ")
        }
    }
}

#[cfg(unix)]
fn listen_for_sighup(trigger: Arc<Trigger>) -> Option<JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(mut hangup) => Some(tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                tracing::info!("SIGHUP received: reloading the config");
                trigger.fire(Cause::Signal);
            }
        })),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP");
            None
        }
    }
}

/// What to watch for one config path, and which events matter. Recomputed after every reload,
/// because a symlink on the path may point somewhere else now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Plan {
    /// Directories to watch (non-recursively), named as the config path reaches them.
    dirs: BTreeSet<PathBuf>,
    /// Events on exactly these paths matter.
    paths: BTreeSet<PathBuf>,
    /// Events on any entry of these directories matter.
    any_in: BTreeSet<PathBuf>,
    /// Events on `..*` entries of these directories matter (a ConfigMap's `..data` swap next to
    /// a single config file).
    kubelet_in: BTreeSet<PathBuf>,
}

impl Plan {
    fn for_path(path: &Path) -> Plan {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let mut plan = Plan::default();
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            plan.dirs.insert(path.clone());
            plan.any_in.insert(path.clone());
        } else if let Some(parent) = path.parent() {
            plan.kubelet_in.insert(parent.to_path_buf());
        }
        // Replacing the path itself or any symlink on the way changes what the path means.
        for step in path.ancestors() {
            let is_link = fs::symlink_metadata(step).is_ok_and(|m| m.file_type().is_symlink());
            if (step == path || is_link)
                && let Some(parent) = step.parent()
            {
                plan.dirs.insert(parent.to_path_buf());
                plan.paths.insert(step.to_path_buf());
            }
        }
        plan
    }

    fn wants(&self, path: &Path) -> bool {
        if self.paths.contains(path) {
            return true;
        }
        let Some(dir) = path.parent() else {
            return false;
        };
        self.any_in.contains(dir)
            || (self.kubelet_in.contains(dir)
                && path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("..")))
    }
}

/// Whether an event should cause a reload.
fn relevant(event: &Event, plan: &Plan) -> bool {
    event.need_rescan()
        || (!matches!(event.kind, EventKind::Access(_))
            && event.paths.iter().any(|p| plan.wants(p)))
}

struct FileWatch {
    debouncer: Debouncer<RecommendedWatcher, RecommendedCache>,
    /// Shared with the event thread, which filters by it.
    plan: Arc<Mutex<Plan>>,
    /// Watched directory → what it resolved to when the watch was added.
    watched: BTreeMap<PathBuf, Option<PathBuf>>,
}

impl FileWatch {
    fn start(
        path: &Path,
        trigger: Arc<Trigger>,
        debounce: Duration,
    ) -> Result<FileWatch, notify_debouncer_full::notify::Error> {
        let plan = Arc::new(Mutex::new(Plan::default()));
        let filter = plan.clone();
        let debouncer = new_debouncer(debounce, None, move |result: DebounceEventResult| {
            if let Err(errors) = &result {
                for error in errors {
                    tracing::warn!(%error, "config watcher error");
                }
            }
            let plan = filter.lock().unwrap_or_else(PoisonError::into_inner);
            // A failing watcher may have lost events: reading once more is the safe answer.
            let reload = match &result {
                Err(_) => true,
                Ok(events) => events.iter().any(|e| relevant(e, &plan)),
            };
            if reload {
                trigger.fire(Cause::FileChange);
            }
        })?;
        let mut watch = FileWatch {
            debouncer,
            plan,
            watched: BTreeMap::new(),
        };
        watch.refresh(path);
        if watch.watched.is_empty() {
            return Err(notify_debouncer_full::notify::Error::generic(
                "no directory of the config path could be watched",
            ));
        }
        Ok(watch)
    }

    /// Brings the watches in line with what `path` means now.
    fn refresh(&mut self, path: &Path) {
        let plan = Plan::for_path(path);
        let stale: Vec<PathBuf> = self
            .watched
            .keys()
            .filter(|dir| !plan.dirs.contains(*dir))
            .cloned()
            .collect();
        for dir in stale {
            self.watched.remove(&dir);
            // The directory may be gone, which removed the watch already.
            let _ = self.debouncer.unwatch(&dir);
        }
        for dir in &plan.dirs {
            let resolved = fs::canonicalize(dir).ok();
            match self.watched.get(dir) {
                Some(previous) if *previous == resolved => continue,
                Some(_) => {
                    let _ = self.debouncer.unwatch(dir);
                    self.watched.remove(dir);
                }
                None => {}
            }
            match self.debouncer.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir.clone(), resolved);
                }
                // Retried at the next refresh; meanwhile the other watches (or SIGHUP) serve.
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot watch"),
            }
        }
        *self.plan.lock().unwrap_or_else(PoisonError::into_inner) = plan;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn set(paths: &[&Path]) -> BTreeSet<PathBuf> {
        paths.iter().map(|p| p.to_path_buf()).collect()
    }

    #[test]
    fn a_directory_is_watched_with_its_parent() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("conf");
        fs::create_dir(&dir).unwrap();
        let plan = Plan::for_path(&dir);
        assert_eq!(plan.dirs, set(&[root.path(), &dir]));
        assert!(plan.wants(&dir.join("a.yaml")));
        assert!(plan.wants(&dir.join("..data")));
        assert!(plan.wants(&dir), "the directory itself replaced");
        assert!(!plan.wants(&root.path().join("other")));
        assert!(!plan.wants(&dir.join("sub").join("a.yaml")));
    }

    #[test]
    fn a_file_is_watched_through_its_directory() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("limits.yaml");
        fs::write(&file, "").unwrap();
        let plan = Plan::for_path(&file);
        assert_eq!(plan.dirs, set(&[root.path()]));
        assert!(plan.wants(&file));
        assert!(plan.wants(&root.path().join("..data")));
        assert!(!plan.wants(&root.path().join("other.yaml")));
    }

    #[test]
    fn every_symlink_on_the_path_is_watched_where_it_lives() {
        // envoyproxy/ratelimit's layout: RUNTIME_ROOT is a symlink to the current version.
        let root = tempfile::tempdir().unwrap();
        let version = root.path().join("v1");
        fs::create_dir_all(version.join("ratelimit/config")).unwrap();
        let current = root.path().join("current");
        symlink(&version, &current).unwrap();
        let config = current.join("ratelimit/config");
        let plan = Plan::for_path(&config);
        assert!(plan.dirs.contains(root.path()), "{plan:?}");
        assert!(plan.dirs.contains(&config));
        assert!(plan.wants(&current));
        assert!(!plan.wants(&root.path().join("v2")));
    }

    #[tokio::test]
    async fn without_a_watcher_only_an_explicit_request_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        let text = |rpu: u32| {
            format!(
                "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {rpu}}}\n"
            )
        };
        fs::write(&file, text(1)).unwrap();
        let store = Arc::new(ConfigStore::new(
            load_path_with(&file, &LoadOptions::default()).unwrap(),
        ));
        let options = ReloadOptions {
            watch: false,
            debounce: Duration::from_millis(10),
            load: LoadOptions::default(),
        };
        let reloader = spawn_reloader(file.clone(), store.clone(), options);
        fs::write(&file, text(2)).unwrap();
        reloader.reload_now();
        let reloaded = tokio::time::timeout(Duration::from_secs(10), async {
            while store.load_counts() != (2, 0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(reloaded.is_ok(), "{:?}", store.load_counts());
        let rejected = {
            fs::write(&file, "domain: [").unwrap();
            reloader.reload_now();
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    if let Some(r) = store.last_rejected() {
                        break r;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .unwrap()
        };
        assert!(
            rejected.source.ends_with("(reload request)"),
            "{}",
            rejected.source
        );
        assert_eq!(store.active().load().rule_count(), 1);
    }

    #[test]
    fn reads_do_not_count_as_changes() {
        use notify_debouncer_full::notify::event::{AccessKind, CreateKind, Flag};
        let plan = Plan {
            any_in: set(&[Path::new("/c")]),
            ..Plan::default()
        };
        let event = |kind, path: &str| Event::new(kind).add_path(PathBuf::from(path));
        let read = event(EventKind::Access(AccessKind::Any), "/c/a.yaml");
        assert!(!relevant(&read, &plan));
        assert!(relevant(
            &event(EventKind::Create(CreateKind::File), "/c/a.yaml"),
            &plan
        ));
        assert!(!relevant(
            &event(EventKind::Create(CreateKind::File), "/elsewhere/a.yaml"),
            &plan
        ));
        // Lost events: whatever they were, read again.
        assert!(relevant(
            &Event::new(EventKind::Other).set_flag(Flag::Rescan),
            &plan
        ));
    }
}
