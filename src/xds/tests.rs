use std::collections::HashMap;

use clap::Parser;

use super::*;
use crate::settings::{Cli, Command};

fn args(flags: &[&str]) -> (XdsArgs, Option<PathBuf>) {
    let mut argv = vec!["sluice", "serve"];
    argv.extend_from_slice(flags);
    let Command::Serve(settings) = Cli::try_parse_from(argv).expect("parses").command else {
        panic!("serve")
    };
    (settings.xds, settings.config)
}

fn resolve_with(flags: &[&str], env: &[(&str, &str)]) -> Result<ConfigSource, XdsSettingsError> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (xds, config) = args(flags);
    resolve(&xds, config.as_deref(), &|name| env.get(name).cloned())
}

fn xds(flags: &[&str], env: &[(&str, &str)]) -> XdsOptions {
    match resolve_with(flags, env).expect("resolves") {
        ConfigSource::Xds(options) => *options,
        ConfigSource::File(path) => panic!("file source {}", path.display()),
    }
}

fn string_fields(node: &Node) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = node
        .metadata
        .iter()
        .flat_map(|m| m.fields.iter())
        .map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => (k.clone(), s.clone()),
            other => (k.clone(), format!("{other:?}")),
        })
        .collect();
    out.sort();
    out
}

#[test]
fn file_is_the_default_and_needs_a_path() {
    assert!(matches!(
        resolve_with(&["--config", "c.yaml"], &[]),
        Ok(ConfigSource::File(p)) if p == Path::new("c.yaml")
    ));
    assert_eq!(
        resolve_with(&[], &[]).unwrap_err(),
        XdsSettingsError::MissingConfigPath
    );
    assert_eq!(
        resolve_with(&[], &[("CONFIG_TYPE", "FILE")]).unwrap_err(),
        XdsSettingsError::MissingConfigPath
    );
    let message = XdsSettingsError::MissingConfigPath.to_string();
    assert!(message.contains("--config-source xds"), "{message}");
}

#[test]
fn xds_needs_no_path_and_ignores_one() {
    let options = xds(&["--config-source", "xds"], &[]);
    assert_eq!(options.server, "http://localhost:18000");
    assert_eq!(options.node.id, "default");
    assert_eq!(options.node.user_agent_name, "sluice");
    assert!(options.node.metadata.is_none());
    assert!(options.tls.is_none());
    assert!(!options.start_without_config);
    xds(&["--config-source", "xds", "--config", "left/over"], &[]);
}

#[test]
fn envoyproxy_names_apply_when_sluice_ones_are_unset() {
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,team=edge"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];
    let options = xds(&[], &env);
    assert_eq!(options.server, "http://envoy-gateway:18001");
    assert_eq!(options.node.id, "envoy-ratelimit");
    assert_eq!(
        string_fields(&options.node),
        [("team".into(), "edge".into()), ("zone".into(), "a".into())]
    );
    assert!(options.start_without_config);

    // The sluice setting (flag or SLUICE_ variable, both arrive through clap) wins.
    let options = xds(
        &[
            "--xds-server",
            "http://cp:9000",
            "--xds-node-id",
            "mine",
            "--xds-node-metadata",
            "k=v",
            "--xds-start-without-config=false",
        ],
        &env,
    );
    assert_eq!(options.server, "http://cp:9000");
    assert_eq!(options.node.id, "mine");
    assert_eq!(string_fields(&options.node), [("k".into(), "v".into())]);
    assert!(!options.start_without_config);
    assert!(matches!(
        resolve_with(&["--config-source", "file", "--config", "c"], &env),
        Ok(ConfigSource::File(_))
    ));
}

#[test]
fn bad_envoyproxy_values_are_named() {
    let err = resolve_with(&[], &[("CONFIG_TYPE", "GRPC_XDS_DELTA")]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "CONFIG_TYPE=\"GRPC_XDS_DELTA\": expected FILE or GRPC_XDS_SOTW"
    );
    let err = resolve_with(
        &["--config-source", "xds"],
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "yes please")],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("FORCE_START_WITHOUT_INITIAL_CONFIG="),
        "{err}"
    );
}

#[test]
fn node_metadata_takes_pairs_or_json() {
    assert_eq!(parse_node_metadata(" ").unwrap(), None);
    let pairs = parse_node_metadata("a=1, b = x=y ,,").unwrap().unwrap();
    let node = Node {
        metadata: Some(pairs),
        ..Default::default()
    };
    assert_eq!(
        string_fields(&node),
        [("a".into(), "1".into()), ("b".into(), "x=y".into())]
    );
    let json = parse_node_metadata(r#"{"zone": "a", "replicas": 3, "tags": ["x"], "tls": true}"#)
        .unwrap()
        .unwrap();
    assert_eq!(
        json.fields["zone"].kind,
        Some(Kind::StringValue("a".into()))
    );
    assert_eq!(json.fields["replicas"].kind, Some(Kind::NumberValue(3.0)));
    assert_eq!(json.fields["tls"].kind, Some(Kind::BoolValue(true)));
    assert!(
        matches!(json.fields["tags"].kind, Some(Kind::ListValue(ref l)) if l.values.len() == 1)
    );
    assert!(matches!(
        parse_node_metadata("zone:a"),
        Err(XdsSettingsError::BadNodeMetadata(m)) if m.contains("`zone:a` is not key=value")
    ));
    assert!(parse_node_metadata("=v").is_err());
    assert!(parse_node_metadata("{\"open\": ").is_err());
}

#[test]
fn tls_follows_the_scheme_the_flag_or_the_files() {
    let on = xds(
        &[
            "--config-source",
            "xds",
            "--xds-server",
            "https://cp:443",
            "--xds-tls-ca",
            "ca.pem",
        ],
        &[],
    );
    assert_eq!(on.server, "https://cp:443");
    assert_eq!(
        on.tls,
        Some(TlsFiles {
            ca: "ca.pem".into(),
            identity: None,
            server_name: None
        })
    );

    // Envoy Gateway's settings: a bare host:port, TLS switched on, mutual TLS files.
    let eg = xds(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
                "envoy-gateway.envoy-gateway-system",
            ),
        ],
    );
    assert_eq!(eg.server, "https://envoy-gateway:18001");
    assert_eq!(
        eg.tls,
        Some(TlsFiles {
            ca: "/certs/ca.crt".into(),
            identity: Some(("/certs/tls.crt".into(), "/certs/tls.key".into())),
            server_name: Some("envoy-gateway.envoy-gateway-system".into()),
        })
    );

    // A CA alone on a bare host:port turns TLS on.
    assert!(
        xds(
            &[
                "--config-source",
                "xds",
                "--xds-server",
                "cp:1",
                "--xds-tls-ca",
                "ca"
            ],
            &[]
        )
        .tls
        .is_some()
    );

    let err = |flags: &[&str]| {
        let mut all = vec!["--config-source", "xds"];
        all.extend_from_slice(flags);
        resolve_with(&all, &[]).unwrap_err().to_string()
    };
    assert!(err(&["--xds-tls"]).contains("--xds-tls-ca"));
    assert!(err(&["--xds-server", "http://cp:1", "--xds-tls"]).contains("contradicts"));
    assert!(err(&["--xds-server", "http://cp:1", "--xds-tls-ca", "ca"]).contains("TLS is off"));
    assert!(err(&["--xds-tls-ca", "ca", "--xds-tls-cert", "c"]).contains("go together"));
    assert!(err(&["--xds-server", "grpc://cp:1"]).contains("scheme"));
    assert!(err(&["--xds-server", "http://"]).starts_with("invalid xDS server"));
    assert!(err(&["--xds-backoff-initial", "0"]).contains("0 < initial <= max"));
}
