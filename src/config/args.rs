//! Config loading and reloading options from their flags ([`LoadArgs`], [`ConfigOpsArgs`]),
//! the same for `serve`, `check-config` and `explain`, so a check sees what the service loads.

use super::LoadOptions;
use super::reload::ReloadOptions;
use crate::settings::{ConfigOpsArgs, LoadArgs};

/// How files become a config; `max_entries` is the request bound (`--max-entries`) deeper
/// descriptors are checked against.
pub fn load_options(args: &LoadArgs, max_entries: usize) -> LoadOptions {
    LoadOptions {
        merge_domains: args.merge_domains,
        dotfiles: args.config_dotfiles,
        shadow_all: args.shadow_mode,
        quota_all: args.quota_mode,
        max_entries,
        default_algorithm: args.default_algorithm,
        default_charge: args.default_charge,
    }
}

/// Loading plus hot reload, for `serve`.
pub fn reload_options(args: &ConfigOpsArgs, max_entries: usize) -> ReloadOptions {
    ReloadOptions {
        watch: args.watch_config,
        debounce: args.watch_debounce,
        load: load_options(&args.load, max_entries),
    }
}
