//! Flags of the subcommands other than `serve`.

use std::path::PathBuf;

use clap::Args;

use super::config::LoadArgs;
use super::flags::{FailureModeArg, OutputFormat};

/// `sluice check-config PATH`.
#[derive(Clone, Debug, Args)]
pub struct CheckConfigArgs {
    /// A YAML file or a directory of *.yaml / *.yml files.
    pub path: PathBuf,

    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,

    /// The request bound of `serve --max-entries`: deeper descriptors are reported unreachable.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = 32)]
    pub max_entries: usize,

    #[command(flatten)]
    pub load: LoadArgs,
}

/// `sluice explain --config PATH --domain D --descriptor k=v,k2=v2`.
#[derive(Clone, Debug, Args)]
pub struct ExplainArgs {
    /// A YAML file or a directory of *.yaml / *.yml files.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: PathBuf,

    #[arg(long)]
    pub domain: String,

    /// The request descriptor's entries: key=value[,key=value...]. Write `,` `=` `%` inside a
    /// key or value as %2C %3D %25.
    #[arg(long, required_unless_present = "bucket", conflicts_with = "bucket")]
    pub descriptor: Option<String>,

    /// An RLQS bucket id instead of a descriptor, in the same syntax; its order does not matter
    /// (it is placed on the descriptor tree as the RLQS service places it).
    #[arg(long)]
    pub bucket: Option<String>,

    /// Prefix of storage keys, as `serve --key-prefix`.
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = "sluice:")]
    pub key_prefix: String,

    /// Failure mode of rules and domains that set none, as `serve --failure-mode`.
    #[arg(long, env = "SLUICE_FAILURE_MODE", value_enum, default_value = "error")]
    pub failure_mode: FailureModeArg,

    /// The request bound of `serve --max-entries`.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = 32)]
    pub max_entries: usize,

    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,

    #[command(flatten)]
    pub load: LoadArgs,
}

/// `sluice top --admin ADDR`: the keys most limited and most active per rule on one replica.
#[derive(Clone, Debug, Args)]
pub struct TopArgs {
    /// The replica's admin listener (`serve --admin-addr`).
    #[arg(long, env = "SLUICE_ADMIN", default_value = "127.0.0.1:6070")]
    pub admin: String,

    /// A file holding the operator token (`serve --admin-token-file`), sent as
    /// `Authorization: Bearer`.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,

    /// Only this rule (its dotted config path, as in the metrics' `rule` label).
    #[arg(long)]
    pub rule: Option<String>,

    /// Keys per list.
    #[arg(long, default_value_t = 10)]
    pub keys: usize,

    /// Time between refreshes.
    #[arg(long, value_parser = super::flags::parse_duration, default_value = "2s")]
    pub interval: std::time::Duration,

    /// Print the view once and exit (1 when the admin listener gave none).
    #[arg(long)]
    pub once: bool,
}

/// `sluice bucket show|reset`: a client of a running sluice's admin listener (`/buckets`).
#[derive(Clone, Debug, Args)]
pub struct BucketArgs {
    #[command(subcommand)]
    pub action: BucketAction,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum BucketAction {
    /// Show a descriptor's buckets as the backend and the replica hold them (GET /buckets); takes
    /// nothing from them.
    Show(BucketTarget),
    /// Reset a descriptor's buckets on every shard, and drop the replica's lease, over-limit
    /// cache entry and RLQS pool tokens of them (DELETE /buckets; the server needs
    /// --admin-write, and this the operator token: --admin-token-file).
    Reset(BucketTarget),
}

/// Which buckets, on which server.
#[derive(Clone, Debug, Args)]
pub struct BucketTarget {
    /// The admin listener of a running sluice: host:port.
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = "127.0.0.1:6070")]
    pub admin: String,

    /// A file holding the operator token (`serve --admin-token-file`), sent as
    /// `Authorization: Bearer`.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,

    /// The descriptor's domain (a configured one).
    #[arg(long)]
    pub domain: String,

    /// Read the entries as an RLQS bucket id (any order) instead of a descriptor.
    #[arg(long)]
    pub bucket: bool,

    /// The descriptor's entries in order, one key=value each. Write `,` `=` `%` inside a key or
    /// value as %2C %3D %25.
    #[arg(required = true, value_name = "KEY=VALUE")]
    pub entries: Vec<String>,
}
