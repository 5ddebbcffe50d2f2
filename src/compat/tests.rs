use std::collections::HashMap;

use super::go::go_duration;
use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn over(t: &Translation, name: &str) -> Option<String> {
    t.overrides.get(name).cloned()
}

fn ignored(t: &Translation) -> Vec<&str> {
    t.ignored.iter().map(|i| i.name.as_str()).collect()
}

#[test]
fn an_unrelated_environment_changes_nothing() {
    let t = apply(&env(&[("PATH", "/bin"), ("HOME", "/root")]));
    assert_eq!(t, Translation::default());
}

#[test]
fn the_runtime_layout_is_the_config_directory() {
    let t = apply(&env(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_CONFIG").as_deref(),
        Some("/data/ratelimit/config")
    );
    assert_eq!(over(&t, "SLUICE_CONFIG_DOTFILES").as_deref(), Some("false"));
    // envoyproxy/ratelimit's defaults: no rate-limit headers, HTTP (probes) on 0.0.0.0:8080.
    assert_eq!(
        over(&t, "SLUICE_RESPONSE_HEADERS").as_deref(),
        Some("false")
    );
    assert_eq!(
        over(&t, "SLUICE_ADMIN_ADDR").as_deref(),
        Some("0.0.0.0:8080")
    );
    let t = apply(&env(&[
        ("RUNTIME_SUBDIRECTORY", "rl"),
        ("RUNTIME_APPDIRECTORY", "limits"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_CONFIG").as_deref(),
        Some("/srv/runtime_data/current/rl/limits")
    );
    assert_eq!(over(&t, "SLUICE_CONFIG_DOTFILES").as_deref(), Some("true"));
}

/// envoyproxy/ratelimit counts every hit, over the limit or not, unless
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is true: a migrated deployment (its runtime layout)
/// counts so through `charge: always` by default; the variable, when set, says which.
#[test]
fn stop_cache_key_increment_sets_the_default_charge() {
    let layout = [("RUNTIME_ROOT", "/data"), ("RUNTIME_SUBDIRECTORY", "rl")];
    let t = apply(&env(&layout));
    assert_eq!(over(&t, "SLUICE_DEFAULT_CHARGE").as_deref(), Some("always"));
    assert!(ignored(&t).is_empty(), "{:?}", t.ignored);
    for (value, charge) in [
        ("true", "if_allowed"),
        ("1", "if_allowed"),
        ("false", "always"),
    ] {
        let mut with = layout.to_vec();
        with.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", value));
        let t = apply(&env(&with));
        assert_eq!(
            over(&t, "SLUICE_DEFAULT_CHARGE").as_deref(),
            Some(charge),
            "{value}"
        );
        assert!(!ignored(&t).contains(&"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"));
        // Without the layout too: the variable itself is the reference's.
        let t = apply(&env(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", value)]));
        assert_eq!(over(&t, "SLUICE_DEFAULT_CHARGE").as_deref(), Some(charge));
    }
    // No envoyproxy/ratelimit environment: sluice's own default stays.
    let t = apply(&env(&[("REDIS_URL", "redis:6379")]));
    assert_eq!(over(&t, "SLUICE_DEFAULT_CHARGE"), None);
    let bad = apply(&env(&[(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "maybe",
    )]));
    assert_eq!(bad.errors.len(), 1, "{:?}", bad.errors);
    // sluice's own variable wins.
    let mut own = layout.to_vec();
    own.push(("SLUICE_DEFAULT_CHARGE", "if_allowed"));
    assert_eq!(over(&apply(&env(&own)), "SLUICE_DEFAULT_CHARGE"), None);
}

#[test]
fn sluice_variables_win() {
    let t = apply(&env(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "rl"),
        ("SLUICE_CONFIG", "/etc/sluice"),
    ]));
    assert_eq!(over(&t, "SLUICE_CONFIG"), None);
    assert!(t.notes.iter().any(|n| n.contains("SLUICE_CONFIG is set")));
}

#[test]
fn listeners_map_to_grpc_and_admin_addresses() {
    let t = apply(&env(&[
        ("GRPC_PORT", "9000"),
        ("PORT", "8080"),
        ("HOST", "::1"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_GRPC_ADDR").as_deref(),
        Some("0.0.0.0:9000")
    );
    assert_eq!(over(&t, "SLUICE_ADMIN_ADDR").as_deref(), Some("[::1]:8080"));
    let t = apply(&env(&[("DEBUG_PORT", "7000")]));
    assert_eq!(
        over(&t, "SLUICE_ADMIN_ADDR").as_deref(),
        Some("0.0.0.0:7000")
    );
    let both = apply(&env(&[("PORT", "8080"), ("DEBUG_PORT", "7000")]));
    assert_eq!(
        over(&both, "SLUICE_ADMIN_ADDR").as_deref(),
        Some("0.0.0.0:8080")
    );
    assert_eq!(ignored(&both), ["DEBUG_PORT"]);
    let local = apply(&env(&[("PORT", "1"), ("HOST", "localhost")]));
    assert_eq!(
        over(&local, "SLUICE_ADMIN_ADDR").as_deref(),
        Some("127.0.0.1:1")
    );
    // A shell's HOST without PORT means nothing here.
    assert_eq!(
        apply(&env(&[("HOST", "my-laptop")])),
        Translation::default()
    );
    let bad = apply(&env(&[
        ("GRPC_PORT", "http"),
        ("PORT", "1"),
        ("HOST", "box"),
    ]));
    assert_eq!(bad.errors.len(), 2, "{:?}", bad.errors);
}

#[test]
fn prometheus_addr_is_the_metrics_listener() {
    let gateway = apply(&env(&[("PROMETHEUS_ADDR", ":19001")]));
    assert_eq!(
        over(&gateway, "SLUICE_METRICS_ADDR").as_deref(),
        Some("0.0.0.0:19001")
    );
    assert!(ignored(&gateway).is_empty(), "{:?}", gateway.ignored);
    let local = apply(&env(&[("PROMETHEUS_ADDR", "localhost:9090")]));
    assert_eq!(
        over(&local, "SLUICE_METRICS_ADDR").as_deref(),
        Some("127.0.0.1:9090")
    );
    let bad = apply(&env(&[("PROMETHEUS_ADDR", "metrics:9090")]));
    assert_eq!(bad.errors.len(), 1, "{:?}", bad.errors);
}

#[test]
fn redis_single_cluster_and_sentinel() {
    let t = apply(&env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.ns:6379"),
        ("REDIS_AUTH", "s3cr:t,x"),
    ]));
    assert_eq!(over(&t, "SLUICE_BACKEND").as_deref(), Some("redis"));
    assert_eq!(
        over(&t, "SLUICE_REDIS_URL").as_deref(),
        Some("redis://s3cr:t%2Cx@redis.ns:6379")
    );
    assert_eq!(over(&t, "SLUICE_REDIS_MODE").as_deref(), Some("standalone"));

    let t = apply(&env(&[
        ("REDIS_TYPE", "cluster"),
        ("REDIS_URL", "a:7000, b:7001"),
        ("REDIS_TLS", "true"),
        ("REDIS_AUTH", "pw"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_REDIS_URL").as_deref(),
        Some("rediss://:pw@a:7000,rediss://:pw@b:7001")
    );
    assert_eq!(over(&t, "SLUICE_REDIS_MODE").as_deref(), Some("cluster"));

    let t = apply(&env(&[
        ("REDIS_TYPE", "SENTINEL"),
        ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ("REDIS_SENTINEL_AUTH", "other"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_REDIS_SENTINEL_MASTER").as_deref(),
        Some("mymaster")
    );
    assert_eq!(
        over(&t, "SLUICE_REDIS_URL").as_deref(),
        Some("redis://s1:26379,redis://s2:26379")
    );
    assert_eq!(ignored(&t), ["REDIS_SENTINEL_AUTH"]);

    let bad = apply(&env(&[
        ("REDIS_TYPE", "SENTINEL"),
        ("REDIS_URL", "onlymaster"),
    ]));
    assert_eq!(bad.errors.len(), 1);
    let bad = apply(&env(&[("REDIS_TYPE", "RING"), ("REDIS_URL", "a:1")]));
    assert!(bad.errors[0].starts_with("REDIS_TYPE"));
}

#[test]
fn redis_unix_sockets_users_and_explicit_urls() {
    let t = apply(&env(&[
        ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
        ("REDIS_AUTH", "me:p@ss"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_REDIS_URL").as_deref(),
        Some("redis+unix:///var/run/nutcracker/ratelimit.sock?user=me&pass=p%40ss")
    );
    let t = apply(&env(&[
        ("REDIS_URL", "h:1"),
        ("REDIS_TLS", "1"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_REDIS_URL").as_deref(),
        Some("rediss://h:1#insecure")
    );
    let t = apply(&env(&[("REDIS_URL", "redis://x:1/2")]));
    assert_eq!(
        over(&t, "SLUICE_REDIS_URL").as_deref(),
        Some("redis://x:1/2")
    );
    // memcache is not Redis: no backend switch, and reported.
    let t = apply(&env(&[("REDIS_URL", "h:1"), ("BACKEND_TYPE", "memcache")]));
    assert_eq!(over(&t, "SLUICE_BACKEND"), None);
    assert_eq!(ignored(&t), ["BACKEND_TYPE"]);
}

#[test]
fn the_per_second_redis_maps_as_the_main_one_does() {
    let t = apply(&env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "main:6379"),
        ("REDIS_AUTH", "main-pw"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", "fast:6380"),
        ("REDIS_PERSECOND_AUTH", "limiter:p@ss"),
        ("REDIS_PERSECOND_TLS", "true"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ("REDIS_PERSECOND_POOL_SIZE", "20"),
        ("REDIS_PERSECOND_PIPELINE_WINDOW", "0"),
    ]));
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    assert_eq!(
        over(&t, "SLUICE_REDIS_URL").as_deref(),
        Some("redis://:main-pw@main:6379")
    );
    assert_eq!(
        over(&t, "SLUICE_REDIS_PER_SECOND_URL").as_deref(),
        Some("rediss://limiter:p%40ss@fast:6380#insecure")
    );
    assert_eq!(
        over(&t, "SLUICE_REDIS_PER_SECOND_MODE").as_deref(),
        Some("standalone")
    );
    assert_eq!(
        t.origins
            .get("SLUICE_REDIS_PER_SECOND_URL")
            .map(String::as_str),
        Some("REDIS_PERSECOND_URL")
    );
    assert!(
        t.notes
            .iter()
            .any(|n| n.starts_with("REDIS_PERSECOND_POOL_SIZE accepted without effect")),
        "{:?}",
        t.notes
    );
    assert_eq!(ignored(&t), Vec::<&str>::new());

    let t = apply(&env(&[
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "1"),
        ("REDIS_PERSECOND_TYPE", "cluster"),
        ("REDIS_PERSECOND_URL", "a:7000, b:7001"),
        ("REDIS_PERSECOND_PIPELINE_WINDOW", "150us"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_REDIS_PER_SECOND_URL").as_deref(),
        Some("redis://a:7000,redis://b:7001")
    );
    assert_eq!(
        over(&t, "SLUICE_REDIS_PER_SECOND_MODE").as_deref(),
        Some("cluster")
    );
    assert_eq!(over(&t, "SLUICE_REDIS_MODE").as_deref(), Some("standalone"));
    assert_eq!(ignored(&t), ["REDIS_PERSECOND_PIPELINE_WINDOW"]);

    let t = apply(&env(&[
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_TYPE", "SENTINEL"),
        ("REDIS_PERSECOND_URL", "fastmaster,s1:26379,s2:26379"),
        ("REDIS_PERSECOND_SENTINEL_AUTH", "other"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_REDIS_PER_SECOND_SENTINEL_MASTER").as_deref(),
        Some("fastmaster")
    );
    assert_eq!(over(&t, "SLUICE_REDIS_SENTINEL_MASTER"), None);
    assert_eq!(
        over(&t, "SLUICE_REDIS_PER_SECOND_URL").as_deref(),
        Some("redis://s1:26379,redis://s2:26379")
    );
    assert_eq!(ignored(&t), ["REDIS_PERSECOND_SENTINEL_AUTH"]);
}

#[test]
fn the_per_second_redis_needs_its_switch_and_its_url() {
    // Off (the reference's default): its variables are noted, nothing is mapped.
    let t = apply(&env(&[
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "false"),
        ("REDIS_PERSECOND_URL", "fast:6380"),
    ]));
    assert_eq!(over(&t, "SLUICE_REDIS_PER_SECOND_URL"), None);
    assert!(t.errors.is_empty() && t.ignored.is_empty(), "{t:?}");
    assert!(
        t.notes
            .iter()
            .any(|n| n == "REDIS_PERSECOND_URL has no effect without REDIS_PERSECOND=true"),
        "{:?}",
        t.notes
    );
    let unset = apply(&env(&[
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND_TLS", "true"),
    ]));
    assert_eq!(over(&unset, "SLUICE_REDIS_PER_SECOND_URL"), None);

    let errors = |pairs: &[(&str, &str)]| apply(&env(pairs)).errors;
    let no_url = errors(&[("REDIS_URL", "main:6379"), ("REDIS_PERSECOND", "true")]);
    assert_eq!(no_url.len(), 1, "{no_url:?}");
    assert!(no_url[0].contains("REDIS_PERSECOND_URL"), "{no_url:?}");
    let empty_url = errors(&[
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", " "),
    ]);
    assert_eq!(empty_url.len(), 1, "{empty_url:?}");
    let no_main = errors(&[
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_URL", "fast:1"),
    ]);
    assert_eq!(no_main.len(), 1, "{no_main:?}");
    assert!(no_main[0].contains("needs REDIS_URL"), "{no_main:?}");
    let bad_switch = errors(&[("REDIS_URL", "main:6379"), ("REDIS_PERSECOND", "yes")]);
    assert_eq!(bad_switch, ["REDIS_PERSECOND: `yes` is not a boolean"]);
    let per_second = |pairs: &[(&str, &str)]| {
        let mut all = vec![("REDIS_URL", "main:6379"), ("REDIS_PERSECOND", "true")];
        all.extend_from_slice(pairs);
        errors(&all)
    };
    let ring = per_second(&[
        ("REDIS_PERSECOND_TYPE", "RING"),
        ("REDIS_PERSECOND_URL", "a:1"),
    ]);
    assert!(ring[0].starts_with("REDIS_PERSECOND_TYPE:"), "{ring:?}");
    let socket = per_second(&[
        ("REDIS_PERSECOND_URL", "a:1"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "udp"),
    ]);
    assert_eq!(
        socket,
        ["REDIS_PERSECOND_URL: REDIS_PERSECOND_SOCKET_TYPE `udp` is not tcp or unix"]
    );
    let sentinel = per_second(&[
        ("REDIS_PERSECOND_TYPE", "sentinel"),
        ("REDIS_PERSECOND_URL", "onlymaster"),
    ]);
    assert!(
        sentinel[0].starts_with("REDIS_PERSECOND_URL: with REDIS_PERSECOND_TYPE=SENTINEL"),
        "{sentinel:?}"
    );
    let bad_tls = per_second(&[
        ("REDIS_PERSECOND_URL", "a:1"),
        ("REDIS_PERSECOND_TLS", "on"),
    ]);
    assert_eq!(bad_tls, ["REDIS_PERSECOND_TLS: `on` is not a boolean"]);
}

#[test]
fn logging_limits_and_headers() {
    let t = apply(&env(&[
        ("LOG_LEVEL", "WARNING"),
        ("LOG_FORMAT", "JSON"),
        ("CACHE_KEY_PREFIX", "rl_"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "300"),
        ("SHADOW_MODE", "True"),
        ("QUOTA_MODE", "true"),
        ("MERGE_DOMAIN_CONFIG", "1"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_REMAINING_HEADER", "X-Left"),
    ]));
    let expect = [
        ("SLUICE_LOG_LEVEL", "warn"),
        ("SLUICE_LOG_FORMAT", "json"),
        ("SLUICE_KEY_PREFIX", "rl_"),
        ("SLUICE_NEAR_LIMIT_RATIO", "0.9"),
        ("SLUICE_EXPIRY_JITTER_MAX", "300s"),
        ("SLUICE_SHADOW_MODE", "true"),
        ("SLUICE_QUOTA_MODE", "true"),
        ("SLUICE_MERGE_DOMAINS", "true"),
        ("SLUICE_RESPONSE_HEADERS", "true"),
        ("SLUICE_HEADER_LIMIT", "RateLimit-Limit"),
        ("SLUICE_HEADER_REMAINING", "X-Left"),
        ("SLUICE_HEADER_RESET", "RateLimit-Reset"),
    ];
    for (name, value) in expect {
        assert_eq!(over(&t, name).as_deref(), Some(value), "{name}");
    }
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    let bad = apply(&env(&[
        ("LOG_LEVEL", "loud"),
        ("NEAR_LIMIT_RATIO", "2"),
        ("SHADOW_MODE", "yes"),
        ("QUOTA_MODE", "on"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "-1"),
    ]));
    assert_eq!(bad.errors.len(), 5, "{:?}", bad.errors);
}

#[test]
fn unsupported_settings_are_reported_unless_harmless() {
    let t = apply(&env(&[
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "statsd"),
        ("USE_DOG_STATSD", "false"),
        ("MEMCACHE_HOST_PORT", "m:11211"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b"),
        ("XDS_CLIENT_BACKOFF_JITTER", "true"),
        ("REDIS_PERSECOND", "false"),
        ("TRACING_EXPORTER_PROTOCOL", "http"),
        ("TRACING_SERVICE_NAME", "RateLimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
    ]));
    assert_eq!(
        ignored(&t),
        [
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "GRPC_SERVER_USE_TLS",
            "MEMCACHE_HOST_PORT",
            "STATSD_HOST",
            "TRACING_EXPORTER_PROTOCOL",
            "TRACING_SERVICE_NAME",
            "USE_STATSD",
        ]
    );
}

#[test]
fn stats_and_tracing_switches_map() {
    let t = apply(&env(&[
        ("DISABLE_STATS", "true"),
        ("TRACING_ENABLED", "true"),
        ("TRACING_SAMPLING_RATE", "0.25"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
    ]));
    assert_eq!(over(&t, "SLUICE_METRICS").as_deref(), Some("false"));
    assert_eq!(
        over(&t, "SLUICE_RESPONSE_DYNAMIC_METADATA").as_deref(),
        Some("true")
    );
    assert_eq!(over(&t, "SLUICE_TRACING").as_deref(), Some("true"));
    assert_eq!(
        over(&t, "SLUICE_TRACE_SAMPLING_RATIO").as_deref(),
        Some("0.25")
    );
    assert!(ignored(&t).is_empty(), "{:?}", t.ignored);
    let bad = apply(&env(&[("TRACING_SAMPLING_RATE", "2")]));
    assert_eq!(bad.errors.len(), 1);
}

#[test]
fn local_cache_size_maps_to_the_over_limit_cache() {
    let t = apply(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")]));
    assert_eq!(over(&t, "SLUICE_OVER_LIMIT_CACHE").as_deref(), Some("true"));
    assert_eq!(
        over(&t, "SLUICE_OVER_LIMIT_CACHE_MAX_KEYS").as_deref(),
        Some("4096")
    );
    let off = apply(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "0")]));
    assert_eq!(
        over(&off, "SLUICE_OVER_LIMIT_CACHE").as_deref(),
        Some("false")
    );
    assert!(ignored(&off).is_empty());
    let bad = apply(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "lots")]));
    assert_eq!(bad.errors.len(), 1, "{:?}", bad.errors);
}

#[test]
fn xds_client_settings_map_with_go_durations() {
    let t = apply(&env(&[
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1m30s"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1.5h"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "4194304"),
    ]));
    assert_eq!(
        over(&t, "SLUICE_XDS_BACKOFF_INITIAL").as_deref(),
        Some("90000ms")
    );
    assert_eq!(
        over(&t, "SLUICE_XDS_BACKOFF_MAX").as_deref(),
        Some("5400000ms")
    );
    assert_eq!(
        over(&t, "SLUICE_XDS_MAX_MESSAGE_BYTES").as_deref(),
        Some("4194304")
    );
    assert_eq!(
        go_duration("250ms"),
        Some(std::time::Duration::from_millis(250))
    );
    assert_eq!(go_duration("0"), Some(std::time::Duration::ZERO));
    assert_eq!(go_duration("10"), None);
    assert_eq!(go_duration("5d"), None);
    let bad = apply(&env(&[("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon")]));
    assert_eq!(bad.errors.len(), 1);
}

#[test]
fn overrides_become_flags_unless_given_on_the_command_line() {
    let t = apply(&env(&[("GRPC_PORT", "9000"), ("PORT", "9001")]));
    let flag_of = |v: &str| {
        v.strip_prefix("SLUICE_")
            .map(|f| format!("--{}", f.to_ascii_lowercase().replace('_', "-")))
    };
    let args: Vec<OsString> = ["sluice", "serve", "--admin-addr=127.0.0.1:1"]
        .iter()
        .map(OsString::from)
        .collect();
    let out: Vec<String> = t
        .args(args, flag_of)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    assert_eq!(
        out,
        [
            "sluice",
            "serve",
            "--admin-addr=127.0.0.1:1",
            "--grpc-addr=0.0.0.0:9000"
        ]
    );
}

#[test]
fn credentials_are_redacted_in_logs() {
    assert!(URL_SETTINGS.contains(&"SLUICE_REDIS_PER_SECOND_URL"));
    assert_eq!(
        redact_userinfo("redis://u:p%40@h:1,rediss://:x@h:2,redis://h:3"),
        "redis://u:***@h:1,rediss://:***@h:2,redis://h:3"
    );
    assert_eq!(
        redact_userinfo("redis+unix:///s.sock?user=u&pass=p"),
        "redis+unix:///s.sock?user=u&pass=***"
    );
}
