//! Flags of config loading and reloading, flattened into `serve`, `check-config` and `explain`.

use std::time::Duration;

use clap::{ArgAction, Args};

use super::LoadOptions;
use super::reload::ReloadOptions;
use crate::algorithm::Algorithm;
use crate::settings::parse_duration;

/// How files become a config (the same for `serve`, `check-config` and `explain`, so a check
/// sees what the service will load).
#[derive(Clone, Debug, Args)]
pub struct LoadArgs {
    /// Files naming the same domain add their descriptors to it instead of being rejected
    /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "SLUICE_MERGE_DOMAINS", default_value_t = false, action = ArgAction::Set)]
    pub merge_domains: bool,

    /// Also read hidden `.*.yaml` files of a config directory (`..*` entries never).
    #[arg(long, env = "SLUICE_CONFIG_DOTFILES", default_value_t = false, action = ArgAction::Set)]
    pub config_dotfiles: bool,

    /// Global shadow mode: every configured rule is counted but never rejects (request `limit`
    /// overrides still do). envoyproxy/ratelimit's SHADOW_MODE.
    #[arg(long, env = "SLUICE_SHADOW_MODE", default_value_t = false, action = ArgAction::Set)]
    pub shadow_mode: bool,

    /// Algorithm of rules whose `rate_limit` and domain name none: token_bucket, fixed_window,
    /// sliding_window or gcra. fixed_window counts as envoyproxy/ratelimit does.
    #[arg(long, env = "SLUICE_DEFAULT_ALGORITHM", value_parser = parse_algorithm, default_value = "token_bucket")]
    pub default_algorithm: Algorithm,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| {
        format!(
            "unknown algorithm `{s}` (expected one of: {})",
            Algorithm::names()
        )
    })
}

impl LoadArgs {
    /// `max_entries` is the request bound (`--max-entries`) deeper descriptors are checked against.
    pub fn options(&self, max_entries: usize) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domains,
            dotfiles: self.config_dotfiles,
            shadow_all: self.shadow_mode,
            max_entries,
            default_algorithm: self.default_algorithm,
        }
    }
}

/// `serve`'s config flags: loading plus hot reload.
#[derive(Clone, Debug, Args)]
pub struct ConfigOpsArgs {
    #[command(flatten)]
    pub load: LoadArgs,

    /// Reload the config when its files change (SIGHUP always reloads).
    #[arg(long, env = "SLUICE_WATCH_CONFIG", default_value_t = true, action = ArgAction::Set)]
    pub watch_config: bool,

    /// Quiet time after the last file change before reloading, so a multi-file update is read
    /// once, whole.
    #[arg(long, env = "SLUICE_WATCH_DEBOUNCE", value_parser = parse_duration, default_value = "200ms")]
    pub watch_debounce: Duration,
}

impl ConfigOpsArgs {
    pub fn reload_options(&self, max_entries: usize) -> ReloadOptions {
        ReloadOptions {
            watch: self.watch_config,
            debounce: self.watch_debounce,
            load: self.load.options(max_entries),
        }
    }
}
