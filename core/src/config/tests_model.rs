//! The compiled config through the public interface: rules and matching, the config as a
//! whole (digest, summary, JSON), envoyproxy/ratelimit's README config and the shipped examples.

use super::tests::{bucket, entries, load, path_of};
use super::*;
use crate::rule::{Limit, Unit};

// ---------------------------------------------------------------------------------------------
// Compiled rules and matching

const NESTED: &str = "domain: api
failure_mode: local
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 400}
    descriptors:
      - key: route
        value: export
        cost: 10
        failure_mode: closed
        rate_limit: {unit: second, requests_per_unit: 5, burst: 50}
      - key: route
        value: admin-*
        descriptors:
          - key: user
            shadow_mode: true
            rate_limit: {unit: hour, requests_per_unit: 3, name: admin-user, replaces: [{name: other}]}
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 1000}
";

#[test]
fn rules_carry_path_limit_and_settings() {
    let config = load(NESTED).unwrap();
    assert_eq!(config.rule_count(), 4);
    let rules: Vec<&Arc<Rule>> = config.rules().collect();
    for (i, rule) in rules.iter().enumerate() {
        assert_eq!(rule.id, RuleId(i as u32));
        assert_eq!(&*rule.domain, "api");
        assert!(Arc::ptr_eq(config.rule(rule.id).unwrap(), rule));
    }
    let paths: Vec<&str> = rules.iter().map(|r| &*r.path).collect();
    assert_eq!(
        paths,
        [
            "api.tenant",
            "api.tenant.route_export",
            "api.tenant.route_admin-*.user",
            "api.tenant_acme"
        ]
    );

    let tenant = rules[0];
    assert_eq!(tenant.limit, bucket(400, Unit::Minute, None));
    assert_eq!(tenant.cost, 1);
    assert_eq!(tenant.failure_mode, Some(FailureMode::Local));
    assert_eq!(&*tenant.source, "t.yaml:4");
    assert!(!tenant.shadow_mode && !tenant.detailed_metric);

    let export = rules[1];
    assert_eq!(export.limit, bucket(5, Unit::Second, Some(50)));
    assert_eq!(export.cost, 10);
    assert_eq!(export.failure_mode, Some(FailureMode::Closed));
    assert_eq!(&*export.source, "t.yaml:7");

    let admin = rules[2];
    assert!(admin.shadow_mode);
    assert_eq!(admin.name.as_deref(), Some("admin-user"));
    assert_eq!(admin.replaces, [Arc::<str>::from("other")]);
    // Not inherited from the `route: admin-*` or `tenant` ancestors: the domain's.
    assert_eq!(admin.failure_mode, Some(FailureMode::Local));

    // Without a domain default, a rule without its own failure_mode has none.
    let plain =
        load("domain: p\ndescriptors: [{key: k, rate_limit: {unit: day, requests_per_unit: 9}}]\n")
            .unwrap();
    assert_eq!(plain.rules().next().unwrap().failure_mode, None);
}

#[test]
fn matching_walks_the_compiled_tree() {
    let config = load(NESTED).unwrap();
    let api = config.domain("api").unwrap();
    let find = |pairs: &[(&str, &str)]| path_of(api, pairs);

    // Exact beats bare.
    assert_eq!(
        find(&[("tenant", "acme")]).as_deref(),
        Some("api.tenant_acme")
    );
    assert_eq!(find(&[("tenant", "globex")]).as_deref(), Some("api.tenant"));
    // Nested rule under a bare key.
    assert_eq!(
        find(&[("tenant", "globex"), ("route", "export")]).as_deref(),
        Some("api.tenant.route_export")
    );
    // Wildcard in the middle of a path.
    assert_eq!(
        find(&[
            ("tenant", "globex"),
            ("route", "admin-users"),
            ("user", "u1")
        ])
        .as_deref(),
        Some("api.tenant.route_admin-*.user")
    );
    // Rule deeper than the request.
    assert_eq!(
        find(&[("tenant", "globex"), ("route", "admin-users")]),
        None
    );
    // Request deeper than the config.
    assert_eq!(
        find(&[("tenant", "globex"), ("route", "export"), ("x", "y")]),
        None
    );
    // The exact `tenant: acme` node has no children: no fallback to the bare `tenant` node.
    assert_eq!(find(&[("tenant", "acme"), ("route", "export")]), None);
    // Unknown key or value.
    assert_eq!(find(&[("route", "export")]), None);
    assert_eq!(find(&[("tenant", "globex"), ("route", "import")]), None);
    assert_eq!(find(&[]), None);
}

#[test]
fn wildcards_match_by_prefix_in_config_order() {
    let config = load(
        "domain: w
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/v2/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/v2/health
    rate_limit: {unlimited: true}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: any
    value: '*'
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: literal
    value: a*b
    rate_limit: {unit: second, requests_per_unit: 5}
",
    )
    .unwrap();
    let w = config.domain("w").unwrap();
    let find = |pairs: &[(&str, &str)]| path_of(w, pairs);
    assert_eq!(
        find(&[("path", "/api/v2/health")]).as_deref(),
        Some("w.path_/api/v2/health")
    );
    // `/api/*` is listed first, so it wins over the narrower `/api/v2/*`.
    assert_eq!(
        find(&[("path", "/api/v2/users")]).as_deref(),
        Some("w.path_/api/*")
    );
    assert_eq!(find(&[("path", "/api/")]).as_deref(), Some("w.path_/api/*"));
    assert_eq!(find(&[("path", "/static")]).as_deref(), Some("w.path"));
    // "*" alone matches every value, the empty one too.
    assert_eq!(find(&[("any", "x")]).as_deref(), Some("w.any_*"));
    assert_eq!(find(&[("any", "")]).as_deref(), Some("w.any_*"));
    // A `*` anywhere is a wildcard, as in envoyproxy/ratelimit: `a*b` is "a, anything, b".
    assert_eq!(
        find(&[("literal", "a*b")]).as_deref(),
        Some("w.literal_a*b")
    );
    assert_eq!(
        find(&[("literal", "axyzb")]).as_deref(),
        Some("w.literal_a*b")
    );
    assert_eq!(find(&[("literal", "ab")]).as_deref(), Some("w.literal_a*b"));
    assert_eq!(find(&[("literal", "axbc")]), None);
    // Unlimited rules are found like any other.
    let health = w.find(&entries(&[("path", "/api/v2/health")])).unwrap();
    assert_eq!(health.limit, Limit::Unlimited);
}

// ---------------------------------------------------------------------------------------------
// Config as a whole

#[test]
fn digest_depends_on_names_and_contents_only() {
    let a = ("a.yaml".to_owned(), "domain: a\n".to_owned());
    let b = ("b.yaml".to_owned(), "domain: b\n".to_owned());
    let one = load_sources(&[a.clone(), b.clone()]).unwrap();
    let swapped = load_sources(&[b.clone(), a.clone()]).unwrap();
    assert_eq!(one.digest(), swapped.digest());
    assert_eq!(one.digest().len(), 40);
    assert!(one.digest().bytes().all(|c| c.is_ascii_hexdigit()));
    let moved = load_sources(&[
        ("/etc/sluice/a.yaml".to_owned(), a.1.clone()),
        ("/etc/sluice/b.yaml".to_owned(), b.1.clone()),
    ])
    .unwrap();
    assert_eq!(one.digest(), moved.digest());
    let edited =
        load_sources(&[a.clone(), ("b.yaml".to_owned(), "domain: b \n".to_owned())]).unwrap();
    assert_ne!(one.digest(), edited.digest());
    let renamed = load_sources(&[a, ("c.yaml".to_owned(), b.1)]).unwrap();
    assert_ne!(one.digest(), renamed.digest());
}

#[test]
fn summary_and_json_describe_the_active_config() {
    let config = load(NESTED).unwrap();
    assert_eq!(
        config.summary(),
        format!("ok: 1 domain, 4 rules, digest {}", &config.digest()[..8])
    );
    let json = config.to_json();
    assert_eq!(json["digest"], config.digest());
    assert_eq!(json["rule_count"], 4);
    let domain = &json["domains"][0];
    assert_eq!(domain["domain"], "api");
    assert_eq!(domain["file"], "t.yaml");
    assert_eq!(domain["failure_mode"], "local");
    let export = &domain["rules"][1];
    assert_eq!(export["path"], "api.tenant.route_export");
    assert_eq!(export["cost"], 10);
    assert_eq!(export["failure_mode"], "closed");
    assert_eq!(export["source"], "t.yaml:7");
    assert_eq!(
        export["limit"],
        serde_json::json!({"bucket": {"requests_per_unit": 5, "unit": "second", "burst": 50}})
    );
    assert_eq!(domain["rules"][2]["name"], "admin-user");
    assert_eq!(domain["rules"][2]["replaces"][0], "other");

    let empty = Config::default();
    assert_eq!(empty.rule_count(), 0);
    assert_eq!(empty.domains().count(), 0);
    assert_eq!(
        empty.summary(),
        format!("ok: 0 domains, 0 rules, digest {}", &empty.digest()[..8])
    );
}

/// The shapes of envoyproxy/ratelimit's README examples, upper-case units as often written.
const README_CONFIG: &str = "---
domain: example
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: SECOND
      requests_per_unit: 500

  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: DAY
          requests_per_unit: 5

  - key: to_number
    rate_limit:
      unit: DAY
      requests_per_unit: 100

  - key: remote_address
    rate_limit:
      unit: Second
      requests_per_unit: 10

  - key: ldap
    rate_limit:
      unlimited: true

  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: SECOND
        shadow_mode: true

  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: SECOND
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: SECOND

  - key: key1
    detailed_metric: true
    rate_limit:
      unit: MINUTE
      requests_per_unit: 10
  - key: foo
    value: bar*
    rate_limit:
      unit: HOUR
      requests_per_unit: 3
";

#[test]
fn envoyproxy_ratelimit_readme_config_loads_unchanged() {
    let src = README_CONFIG;
    let config = load(src).unwrap();
    assert_eq!(config.rule_count(), 10);
    let d = config.domain("example").unwrap();
    let rule = |pairs: &[(&str, &str)]| d.find(&entries(pairs)).unwrap().clone();
    assert_eq!(
        rule(&[("message_type", "marketing"), ("to_number", "2061111111")]).limit,
        bucket(5, Unit::Day, None)
    );
    assert_eq!(
        rule(&[("to_number", "2061111111")]).limit,
        bucket(100, Unit::Day, None)
    );
    assert_eq!(rule(&[("ldap", "x")]).limit, Limit::Unlimited);
    assert!(rule(&[("service", "s"), ("user", "user-a")]).shadow_mode);
    assert_eq!(
        rule(&[("key_2", "value_2"), ("user", "bkthomps")]).replaces,
        [Arc::<str>::from("specific_limit")]
    );
    assert!(rule(&[("key1", "v")]).detailed_metric);
    assert_eq!(&*rule(&[("foo", "barbaz")]).path, "example.foo_bar*");
}

// ---------------------------------------------------------------------------------------------
// The shipped example configs

fn examples() -> Config {
    load_path(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../config"))
        .unwrap_or_else(|e| panic!("config/ must load:\n{e}"))
}

#[test]
fn example_edge_config_matches_as_documented() {
    let config = examples();
    let edge = config.domain("edge").unwrap();
    assert_eq!(edge.failure_mode, Some(FailureMode::Local));
    let rule = |pairs: &[(&str, &str)]| edge.find(&entries(pairs)).cloned();

    let tenant = rule(&[("tenant", "acme")]).unwrap();
    assert_eq!(&*tenant.path, "edge.tenant");
    assert_eq!(tenant.limit, bucket(600, Unit::Minute, Some(100)));
    assert_eq!(tenant.name.as_deref(), Some("tenant-default"));
    assert_eq!(tenant.failure_mode, Some(FailureMode::Local));

    let export = rule(&[("tenant", "acme"), ("route", "export")]).unwrap();
    assert_eq!(&*export.path, "edge.tenant.route_export");
    assert_eq!(export.limit, bucket(5, Unit::Second, Some(50)));
    assert_eq!(export.cost, 10);

    let login = rule(&[("tenant", "acme"), ("route", "login")]).unwrap();
    assert_eq!(login.limit, bucket(20, Unit::Minute, None));
    assert_eq!(login.failure_mode, Some(FailureMode::Closed));
    assert_eq!(rule(&[("tenant", "acme"), ("route", "other")]), None);

    let internal = rule(&[("tenant", "internal-billing")]).unwrap();
    assert_eq!(&*internal.path, "edge.tenant_internal-*");
    assert_eq!(internal.limit, Limit::Unlimited);
    assert_eq!(
        rule(&[("tenant", "internal-billing"), ("route", "export")]),
        None
    );

    let ip = rule(&[("remote_address", "10.0.0.1")]).unwrap();
    assert_eq!(ip.limit, bucket(50, Unit::Second, None));
    assert!(ip.shadow_mode && ip.detailed_metric);

    let free = rule(&[("plan", "free"), ("tenant", "acme")]).unwrap();
    assert_eq!(&*free.path, "edge.plan_free.tenant");
    assert_eq!(free.limit, bucket(100, Unit::Minute, None));
    assert_eq!(free.name.as_deref(), Some("free-tenant"));
    assert_eq!(free.replaces, [Arc::<str>::from("tenant-default")]);
    assert_eq!(rule(&[("plan", "free")]), None);
    assert_eq!(rule(&[("plan", "paid"), ("tenant", "acme")]), None);

    assert_eq!(edge.rules().len(), 6);
    assert!(edge.file().ends_with("edge.yaml"));
}

#[test]
fn example_internal_config_matches_as_documented() {
    let config = examples();
    assert_eq!(config.domains().count(), 2);
    let internal = config.domain("internal").unwrap();
    assert_eq!(internal.failure_mode, Some(FailureMode::Open));
    let rule = |pairs: &[(&str, &str)]| internal.find(&entries(pairs)).cloned().unwrap();
    assert_eq!(
        rule(&[("service", "reports")]).limit,
        bucket(1000, Unit::Hour, None)
    );
    assert_eq!(
        rule(&[("service", "search")]).limit,
        bucket(50_000, Unit::Day, None)
    );
    let per_user = rule(&[("job", "nightly"), ("user", "u1")]);
    assert_eq!(per_user.limit, bucket(60, Unit::Hour, None));
    assert_eq!(per_user.failure_mode, Some(FailureMode::Open));
    assert_eq!(config.rule_count(), 9);
    assert!(
        config
            .summary()
            .starts_with("ok: 2 domains, 9 rules, digest ")
    );
}
