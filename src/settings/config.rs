//! Flags of config loading and reloading, flattened into `serve`, `check-config` and `explain`.

use std::time::Duration;

use clap::{ArgAction, Args};
use sluice_core::algorithm::Algorithm;
use sluice_core::rule::Charge;

use super::flags::{parse_algorithm, parse_charge, parse_duration};

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

    /// Global quota mode: every descriptor is in quota mode, so a request is rejected only when
    /// every one of its limited descriptors is over its limit (and then nothing is counted).
    /// envoyproxy/ratelimit's QUOTA_MODE.
    #[arg(long, env = "SLUICE_QUOTA_MODE", default_value_t = false, action = ArgAction::Set)]
    pub quota_mode: bool,

    /// Algorithm of rules whose `rate_limit` and domain name none: token_bucket, fixed_window,
    /// sliding_window or gcra. fixed_window counts as envoyproxy/ratelimit does.
    #[arg(long, env = "SLUICE_DEFAULT_ALGORITHM", value_parser = parse_algorithm, default_value = "token_bucket")]
    pub default_algorithm: Algorithm,

    /// When hits of rules whose descriptor and domain name no `charge` are counted: if_allowed
    /// (only when the request is allowed and they fit) or always (whatever the answer, into
    /// debt; envoyproxy/ratelimit's default).
    #[arg(long, env = "SLUICE_DEFAULT_CHARGE", value_parser = parse_charge, default_value = "if_allowed")]
    pub default_charge: Charge,
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
