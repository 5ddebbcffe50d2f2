//! Config from an xDS management server (ADS, state of the world), as Envoy Gateway and other
//! control planes push it to envoyproxy/ratelimit with `CONFIG_TYPE=GRPC_XDS_SOTW`.
//!
//! - [`resolve`]: the flags ([`XdsArgs`]), plus envoyproxy/ratelimit's environment names for the
//!   same settings (`CONFIG_TYPE`, `CONFIG_GRPC_XDS_*`, `FORCE_START_WITHOUT_INITIAL_CONFIG`),
//!   read only when the `SLUICE_*` variable and the flag are both unset.
//! - `convert`: a push → the YAML sources the file loader validates (same rules, same messages).
//! - `client`: the ADS stream: subscribe, install or reject, ACK or NACK, reconnect with backoff.
//! - [`proto`]: `ratelimit.config.ratelimit.v3`, generated from `proto/` at build time.

mod client;
mod convert;
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use tokio::sync::watch;

use crate::admin::Readiness;
use crate::config::ConfigStore;
use crate::settings::{ConfigSourceArg, Settings, XdsArgs};

pub use client::{Backoff, Pause, TokioPause, XdsClient};
pub use convert::{RATE_LIMIT_CONFIG_TYPE, load_push};

/// Where `serve` takes its config from, every setting resolved.
#[derive(Clone, Debug)]
pub enum ConfigSource {
    File(PathBuf),
    Xds(Box<XdsOptions>),
}

/// A resolved xDS client configuration.
#[derive(Clone, Debug)]
pub struct XdsOptions {
    /// `http://…` or `https://…`.
    pub server: String,
    pub node: Node,
    pub tls: Option<TlsFiles>,
    pub start_without_config: bool,
    pub backoff: Backoff,
    pub connect_timeout: Duration,
    pub max_message_bytes: usize,
    /// How pushed configs are compiled (global shadow mode, merged domains), as files are.
    pub load: crate::config::LoadOptions,
}

/// PEM files for the channel, read at each connection attempt so rotated certificates are
/// picked up on the next reconnect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    /// Certificate and key, for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    pub server_name: Option<String>,
}

/// A setting that makes no sense; the message names the flag or variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum XdsSettingsError {
    #[error(
        "--config (SLUICE_CONFIG) is required when the config source is `file`; to take config from an xDS server set --config-source xds (or CONFIG_TYPE=GRPC_XDS_SOTW)"
    )]
    MissingConfigPath,
    #[error("{name}={value:?}: expected {expected}")]
    BadValue {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("invalid xDS server `{0}`: {1}")]
    BadServer(String, String),
    #[error("invalid xDS node metadata: {0}")]
    BadNodeMetadata(String),
    #[error("xDS TLS: {0}")]
    Tls(String),
}

const DEFAULT_SERVER: &str = "localhost:18000";
const DEFAULT_NODE_ID: &str = "default";

/// Resolves the config source from `settings` and the process environment.
/// TLS files are checked here so a typo fails the start instead of every reconnect.
pub fn config_source(settings: &Settings) -> Result<ConfigSource, XdsSettingsError> {
    let source = resolve(&settings.xds, settings.config.as_deref(), &|name| {
        std::env::var(name).ok()
    })?;
    if let ConfigSource::Xds(options) = &source
        && let Some(tls) = &options.tls
    {
        let identity = tls.identity.iter().flat_map(|(c, k)| [c, k]);
        for path in std::iter::once(&tls.ca).chain(identity) {
            if let Err(e) = std::fs::File::open(path) {
                return Err(XdsSettingsError::Tls(format!(
                    "cannot read {}: {e}",
                    path.display()
                )));
            }
        }
    }
    Ok(source)
}

/// As [`config_source`], with the environment injected.
pub fn resolve(
    args: &XdsArgs,
    config: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConfigSource, XdsSettingsError> {
    if source_kind(args, env)? == ConfigSourceArg::File {
        return config
            .map(|p| ConfigSource::File(p.to_path_buf()))
            .ok_or(XdsSettingsError::MissingConfigPath);
    }
    if let Some(path) = config {
        // Deployments migrated from envoyproxy/ratelimit may still carry a file setting.
        tracing::warn!(path = %path.display(), "--config is ignored: config comes from the xDS server");
    }
    let aliases = Aliases(env);
    let (server, tls) = xds_server(args, &aliases)?;
    let node = xds_node(args, &aliases)?;
    let start_without_config = aliases
        .boolean(
            args.xds_start_without_config,
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
        )?
        .unwrap_or(false);
    if args.xds_backoff_initial.is_zero() || args.xds_backoff_max < args.xds_backoff_initial {
        return Err(XdsSettingsError::BadValue {
            name: "--xds-backoff-initial/--xds-backoff-max",
            value: format!("{:?}/{:?}", args.xds_backoff_initial, args.xds_backoff_max),
            expected: "0 < initial <= max",
        });
    }
    Ok(ConfigSource::Xds(Box::new(XdsOptions {
        server,
        node,
        tls,
        start_without_config,
        backoff: Backoff {
            initial: args.xds_backoff_initial,
            max: args.xds_backoff_max,
        },
        connect_timeout: args.xds_connect_timeout,
        max_message_bytes: args.xds_max_message_bytes,
        load: crate::config::LoadOptions::default(),
    })))
}

/// `--config-source`, else envoyproxy/ratelimit's `CONFIG_TYPE`, else files.
fn source_kind(
    args: &XdsArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConfigSourceArg, XdsSettingsError> {
    Ok(match args.config_source {
        Some(source) => source,
        None => match env("CONFIG_TYPE") {
            None => ConfigSourceArg::File,
            Some(v) if v.eq_ignore_ascii_case("FILE") => ConfigSourceArg::File,
            Some(v) if v.eq_ignore_ascii_case("GRPC_XDS_SOTW") => ConfigSourceArg::Xds,
            Some(value) => {
                return Err(XdsSettingsError::BadValue {
                    name: "CONFIG_TYPE",
                    value,
                    expected: "FILE or GRPC_XDS_SOTW",
                });
            }
        },
    })
}

/// A flag's value, else its envoyproxy/ratelimit environment variable's.
struct Aliases<'e>(&'e dyn Fn(&str) -> Option<String>);

impl Aliases<'_> {
    fn text(&self, flag: &Option<String>, alias: &str) -> Option<String> {
        flag.clone().or_else(|| (self.0)(alias))
    }

    /// An empty variable is no path.
    fn path(&self, flag: &Option<PathBuf>, alias: &str) -> Option<PathBuf> {
        flag.clone()
            .or_else(|| (self.0)(alias).filter(|v| !v.is_empty()).map(PathBuf::from))
    }

    /// The variable in Go's `strconv.ParseBool` spellings.
    fn boolean(
        &self,
        flag: Option<bool>,
        alias: &'static str,
    ) -> Result<Option<bool>, XdsSettingsError> {
        match flag {
            Some(b) => Ok(Some(b)),
            None => (self.0)(alias).map(|v| parse_go_bool(alias, v)).transpose(),
        }
    }
}

/// The management server's URI and the TLS files to reach it with.
fn xds_server(
    args: &XdsArgs,
    aliases: &Aliases<'_>,
) -> Result<(String, Option<TlsFiles>), XdsSettingsError> {
    let tls_files = (
        aliases.path(&args.xds_tls_ca, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
        aliases.path(&args.xds_tls_cert, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
        aliases.path(&args.xds_tls_key, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
    );
    let server_name = aliases
        .text(&args.xds_tls_server_name, "CONFIG_GRPC_XDS_SERVER_TLS_SAN")
        .filter(|s| !s.is_empty());
    let use_tls = aliases.boolean(args.xds_tls, "CONFIG_GRPC_XDS_SERVER_USE_TLS")?;
    let raw_server = aliases
        .text(&args.xds_server, "CONFIG_GRPC_XDS_SERVER_URL")
        .unwrap_or(DEFAULT_SERVER.into());
    server_and_tls(&raw_server, use_tls, tls_files, server_name)
}

/// The node sluice introduces itself as: its id, metadata and user agent.
fn xds_node(args: &XdsArgs, aliases: &Aliases<'_>) -> Result<Node, XdsSettingsError> {
    let node_id = aliases
        .text(&args.xds_node_id, "CONFIG_GRPC_XDS_NODE_ID")
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_NODE_ID.into());
    let metadata = match aliases.text(&args.xds_node_metadata, "CONFIG_GRPC_XDS_NODE_METADATA") {
        Some(raw) => parse_node_metadata(&raw)?,
        None => None,
    };
    Ok(Node {
        id: node_id,
        metadata,
        user_agent_name: "sluice".into(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").into(),
        )),
        ..Default::default()
    })
}

type TlsPaths = (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>);

/// The server URI with its scheme, and the TLS files when TLS is on.
fn server_and_tls(
    raw: &str,
    use_tls: Option<bool>,
    (ca, cert, key): TlsPaths,
    server_name: Option<String>,
) -> Result<(String, Option<TlsFiles>), XdsSettingsError> {
    let bad = |why: &str| XdsSettingsError::BadServer(raw.to_owned(), why.to_owned());
    let scheme_tls = match raw.split_once("://") {
        Some(("https", _)) => Some(true),
        Some(("http", _)) => Some(false),
        Some(_) => return Err(bad("the scheme must be http or https (or none: host:port)")),
        None => None,
    };
    let any_file = ca.is_some() || cert.is_some() || key.is_some();
    let tls = match (use_tls, scheme_tls) {
        (Some(true), Some(false)) | (Some(false), Some(true)) => {
            return Err(bad("the URL scheme contradicts --xds-tls"));
        }
        (Some(explicit), _) => explicit,
        (None, Some(scheme)) => scheme,
        (None, None) => any_file,
    };
    let server = match scheme_tls {
        Some(_) => raw.to_owned(),
        None if tls => format!("https://{raw}"),
        None => format!("http://{raw}"),
    };
    match server.parse::<tonic::transport::Uri>() {
        Ok(uri) if uri.host().is_some_and(|h| !h.is_empty()) => {}
        Ok(_) => return Err(bad("no host")),
        Err(e) => return Err(bad(&e.to_string())),
    }
    if !tls {
        if any_file {
            return Err(XdsSettingsError::Tls(
                "TLS files are given but TLS is off (use an https:// URL or --xds-tls)".into(),
            ));
        }
        return Ok((server, None));
    }
    let Some(ca) = ca else {
        return Err(XdsSettingsError::Tls(
            "--xds-tls-ca (CONFIG_GRPC_XDS_SERVER_TLS_CACERT) is required: sluice trusts no built-in roots".into(),
        ));
    };
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(XdsSettingsError::Tls(
                "--xds-tls-cert and --xds-tls-key go together".into(),
            ));
        }
    };
    Ok((
        server,
        Some(TlsFiles {
            ca,
            identity,
            server_name,
        }),
    ))
}

/// `k1=v1,k2=v2` as envoyproxy/ratelimit reads it (every value a string), or a JSON object for
/// structured values. Empty means no metadata.
pub fn parse_node_metadata(raw: &str) -> Result<Option<Struct>, XdsSettingsError> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    if trimmed.starts_with('{') {
        let json: serde_json::Value = serde_json::from_str(trimmed)
            .map_err(|e| XdsSettingsError::BadNodeMetadata(format!("not valid JSON: {e}")))?;
        let serde_json::Value::Object(map) = json else {
            unreachable!("text starting with `{{` parses only as an object");
        };
        return Ok(Some(Struct {
            fields: map.into_iter().map(|(k, v)| (k, json_value(v))).collect(),
        }));
    }
    let mut fields = std::collections::HashMap::new();
    for entry in trimmed.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(XdsSettingsError::BadNodeMetadata(format!(
                "`{entry}` is not key=value (expected k1=v1,k2=v2 or a JSON object)"
            )));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(XdsSettingsError::BadNodeMetadata(format!(
                "`{entry}` has an empty key"
            )));
        }
        fields.insert(
            key.to_owned(),
            Value {
                kind: Some(Kind::StringValue(value.trim().to_owned())),
            },
        );
    }
    Ok(Some(Struct { fields }))
}

fn json_value(v: serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(Struct {
            fields: map.into_iter().map(|(k, v)| (k, json_value(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

/// Go's `strconv.ParseBool`, which envoyproxy/ratelimit's settings use.
fn parse_go_bool(name: &'static str, value: String) -> Result<bool, XdsSettingsError> {
    match value.as_str() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(XdsSettingsError::BadValue {
            name,
            value,
            expected: "true or false",
        }),
    }
}

/// Starts the xDS client for a started server; it runs until `stop` turns true.
pub fn spawn(
    options: Box<XdsOptions>,
    store: Arc<ConfigStore>,
    readiness: Arc<Readiness>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tracing::info!(server = %options.server, node = %options.node.id, "config from xDS");
    let client = XdsClient::new(*options, store, readiness);
    tokio::spawn(client.run(stop))
}

#[cfg(test)]
mod tests;
