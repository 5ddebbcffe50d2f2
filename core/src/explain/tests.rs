use super::*;
use crate::config::load_sources;

fn options() -> ExplainOptions {
    ExplainOptions {
        key_prefix: "sluice:".into(),
        default_failure_mode: FailureMode::Error,
    }
}

fn config() -> Config {
    let text = r#"domain: api
failure_mode: open
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 400}
    descriptors:
      - key: route
        value: export
        cost: 10
        failure_mode: local
        rate_limit: {unit: second, requests_per_unit: 5, burst: 50, name: export}
      - key: route
        value: "adm*"
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: health
    rate_limit: {unlimited: true}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: block
    rate_limit: {unit: minute, requests_per_unit: 0}
"#;
    load_sources(&[("api.yaml".into(), text.into())]).unwrap()
}

fn run(domain: &str, descriptor: &str) -> Report {
    explain(
        &config(),
        domain,
        &parse_descriptor(descriptor).unwrap(),
        &options(),
    )
}

#[test]
fn descriptors_parse_with_percent_encoding() {
    assert_eq!(
        parse_descriptor("a=1,b=x=y,c=%2C%3D%25,d=").unwrap(),
        [
            Entry::new("a", "1"),
            Entry::new("b", "x=y"),
            Entry::new("c", ",=%"),
            Entry::new("d", "")
        ]
    );
    assert_eq!(parse_descriptor(""), Err(DescriptorArgError::Empty));
    assert_eq!(
        parse_descriptor("a=1,b"),
        Err(DescriptorArgError::NotAPair {
            index: 2,
            text: "b".into()
        })
    );
    assert_eq!(
        parse_descriptor("=1"),
        Err(DescriptorArgError::EmptyKey { index: 1 })
    );
    assert_eq!(
        parse_descriptor("%FF=a"),
        Err(DescriptorArgError::NotUtf8 { index: 1 })
    );
    assert_eq!(
        parse_descriptor("a=x%FF").unwrap(),
        [Entry::new("a", b"x\xff".as_slice())],
        "a value is bytes"
    );
}

#[test]
fn a_match_reports_bucket_failure_mode_and_key() {
    let report = run("api", "tenant=acme,route=export");
    assert!(report.matched && report.domain_known);
    let rule = report.rule.as_ref().unwrap();
    assert_eq!(rule.path, "api.tenant.route_export");
    assert_eq!(rule.source, "api.yaml:7");
    assert_eq!(rule.name.as_deref(), Some("export"));
    let bucket = rule.bucket.as_ref().unwrap();
    assert_eq!(
        (bucket.capacity, bucket.cost, bucket.refill_per_second),
        (50, 10, 5.0)
    );
    assert_eq!(
        (rule.failure_mode, rule.failure_mode_from),
        (FailureMode::Local, "config")
    );
    assert_eq!(
        rule.key.as_deref(),
        Some("sluice:{api|tenant=acme}|route=export")
    );
    assert_eq!(report.steps[0].matched_by, "any value");
    assert_eq!(report.steps[1].matched_by, "exact");
    let text = report.to_text();
    for line in [
        "rule:        api.tenant.route_export (name `export`)",
        "source:      api.yaml:7",
        "algorithm:   token_bucket (from default)",
        "bucket:      capacity 50 tokens, refill 5 tokens/s, cost 10 per hit",
        "on failure:  local (from config)",
        "key:         sluice:{api|tenant=acme}|route=export",
    ] {
        assert!(text.contains(line), "{line}\nin\n{text}");
    }
}

#[test]
fn wildcards_shadow_and_the_domain_failure_mode_are_reported() {
    let report = run("api", "tenant=t,route=admin");
    let rule = report.rule.as_ref().unwrap();
    assert!(rule.shadow);
    assert_eq!(report.steps[1].configured_value.as_deref(), Some("adm*"));
    assert_eq!(rule.failure_mode, FailureMode::Open);
    assert!(report.outcome.contains("shadow"));
    let slow = rule.bucket.as_ref().unwrap().refill_per_second;
    assert!((slow - 1.0 / 3600.0).abs() < 1e-12);
    assert!(report.to_text().contains("refill 0.0002778 tokens/s"));
}

#[test]
fn unlimited_rules_have_no_bucket_or_key() {
    let report = run("api", "health=x");
    let rule = report.rule.as_ref().unwrap();
    assert!(rule.unlimited && rule.bucket.is_none() && rule.key.is_none());
    assert!(rule.algorithm.is_none());
    assert!(!report.to_text().contains("algorithm:"));
    assert!(report.to_text().contains("limit:       unlimited"));
}

#[test]
fn a_blocking_rule_has_no_bucket_and_says_it_rejects() {
    let report = run("api", "block=x");
    let rule = report.rule.as_ref().unwrap();
    assert_eq!(rule.blocked, Some(Unit::Minute));
    assert!(!rule.unlimited && rule.bucket.is_none() && rule.key.is_none());
    let text = report.to_text();
    assert!(
        text.contains("limit:       0 per minute (blocks every request)"),
        "{text}"
    );
    assert!(
        report.outcome.starts_with("OVER_LIMIT always"),
        "{}",
        report.outcome
    );
}

#[test]
fn misses_say_why() {
    let reason = |d: &str, desc: &str| run(d, desc).reason.unwrap();
    assert_eq!(
        reason("web", "a=1"),
        "domain `web` is not configured (configured domains: api)"
    );
    assert!(!run("web", "a=1").domain_known);
    assert_eq!(
        reason("api", "nope=1"),
        "entry 1 `nope=1` matches no descriptor at the top level (keys configured there: block, health, plain, tenant)"
    );
    assert_eq!(
        reason("api", "tenant=a,verb=get"),
        "entry 2 `verb=get` matches no descriptor under entry 1 (keys configured there: route)"
    );
    assert_eq!(
        reason("api", "plain=a,route=export"),
        "depth mismatch: entry 1 `plain=a` reached a descriptor with no nested descriptors, but 1 more entry follows"
    );
    let partial = run("api", "tenant=a,route=other");
    assert_eq!(partial.steps.len(), 1);
    assert!(
        partial
            .reason
            .as_deref()
            .unwrap()
            .starts_with("entry 2 `route=other` matches no descriptor under entry 1")
    );
    let json = serde_json::to_value(&partial).unwrap();
    assert_eq!(json["matched"], false);
    assert!(json.get("rule").is_none());
}

#[test]
fn each_algorithm_is_named_with_its_origin_shape_and_key() {
    let text = r#"domain: w
algorithm: fixed_window
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: gcra
    cost: 2
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: gcra, burst: 8}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket}
"#;
    let config = load_sources(&[("w.yaml".into(), text.into())]).unwrap();
    let report = |key: &str| explain(&config, "w", &[Entry::new(key, "x")], &options());
    let cases = [
        (
            "fixed",
            Algorithm::FixedWindow,
            "domain",
            "window:      60 hits per minute aligned to the clock, cost 1 per hit",
            "sluice:{w|fixed=x}~fw",
            "the count starts again at the next minute on the clock",
        ),
        (
            "sliding",
            Algorithm::SlidingWindow,
            "rule",
            "window:      100 hits per sliding hour (this hour + the previous one, weighted), cost 1 per hit",
            "sluice:{w|sliding=x}~sw",
            "plus the previous hour's, weighted by its overlap",
        ),
        (
            "gcra",
            Algorithm::Gcra,
            "rule",
            "schedule:    one hit every 250 ms, burst 8, cost 2 per hit",
            "sluice:{w|gcra=x}~gcra",
            "one every 250 ms, up to 8 at once",
        ),
        (
            "bucket",
            Algorithm::TokenBucket,
            "rule",
            "bucket:      capacity 4 tokens, refill 4 tokens/s, cost 1 per hit",
            "sluice:{w|bucket=x}",
            "while the bucket holds the hit's tokens",
        ),
    ];
    for (key, algorithm, from, shape, storage, outcome) in cases {
        let r = report(key);
        let rule = r.rule.as_ref().unwrap();
        assert_eq!(rule.algorithm, Some(algorithm), "{key}");
        assert_eq!(rule.algorithm_from, Some(from), "{key}");
        assert_eq!(rule.key.as_deref(), Some(storage), "{key}");
        assert!(r.outcome.contains(outcome), "{key}: {}", r.outcome);
        let text = r.to_text();
        let named = format!("algorithm:   {algorithm} (from {from})");
        for line in [named.as_str(), shape] {
            assert!(text.contains(line), "{line}\nin\n{text}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["rule"]["algorithm"], algorithm.as_str());
    }
}

#[test]
fn a_sharded_rule_shows_its_shards_and_every_shard_key() {
    let text = "domain: hot\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100, shards: 4, lease: 5}\n";
    let config = load_sources(&[("hot.yaml".into(), text.into())]).unwrap();
    let report = explain(&config, "hot", &[Entry::new("tenant", "acme")], &options());
    let rule = report.rule.as_ref().unwrap();
    assert_eq!(rule.key, None);
    assert_eq!(
        rule.shard_keys,
        (0..4)
            .map(|i| format!("sluice:{{hot|tenant=acme~s{i}}}"))
            .collect::<Vec<_>>()
    );
    let bucket = rule.bucket.as_ref().unwrap();
    assert_eq!(bucket.capacity, 100, "the rule's full limit");
    assert_eq!(
        bucket.shards,
        Some(ShardView {
            count: 4,
            requests_per_unit: 25,
            capacity: 25,
            refill_per_second: 25.0 / 60.0,
        })
    );
    assert!(
        report
            .outcome
            .ends_with("; judged by one of 4 shards (the limit / 4 each), chosen per request"),
        "{}",
        report.outcome
    );
    let text = report.to_text();
    for line in [
        "limit:       100 per minute",
        "lease:       up to 5 tokens per backend call",
        "shards:      4 of 25 per minute each (capacity 25), one slot each; a request is judged by one",
        "keys:        sluice:{hot|tenant=acme~s0}\n             sluice:{hot|tenant=acme~s1}\n",
        "             sluice:{hot|tenant=acme~s3}\n",
    ] {
        assert!(text.contains(line), "{line}\nin\n{text}");
    }
    assert!(!text.contains("key:  "), "{text}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["rule"]["bucket"]["shards"]["count"], 4);
    assert_eq!(json["rule"]["shard_keys"].as_array().unwrap().len(), 4);
    assert!(json["rule"].get("key").is_none());
    // Unsharded rules have neither.
    let plain = serde_json::to_value(run("api", "plain=x")).unwrap();
    assert!(plain["rule"].get("shard_keys").is_none());
    assert!(plain["rule"]["bucket"].get("shards").is_none());
}

#[test]
fn a_descriptor_stopping_at_a_tree_node_is_a_depth_mismatch() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n";
    let config = load_sources(&[("d.yaml".into(), text.into())]).unwrap();
    let report = explain(&config, "d", &[Entry::new("a", "1")], &options());
    assert_eq!(
        report.reason.as_deref(),
        Some(
            "depth mismatch: entry 1 `a=1` reached a descriptor without a rate_limit of its own; a longer descriptor continues with: b"
        )
    );
}

#[test]
fn a_bucket_id_is_explained_through_its_placement() {
    let text = "domain: mesh
descriptors:
  - key: tenant
    descriptors:
      - key: route
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: free
    rate_limit: {unlimited: true}
";
    let config = load_sources(&[("m.yaml".into(), text.into())]).unwrap();
    let bucket = [Entry::new("route", "export"), Entry::new("tenant", "acme")];
    let report = explain_bucket(&config, "mesh", &bucket, &options()).unwrap();
    let placed: Vec<&str> = report
        .placed
        .descriptor
        .iter()
        .map(|e| e.key.as_str())
        .collect();
    assert_eq!(placed, ["tenant", "route"]);
    assert!(report.placed.matched);
    assert_eq!(
        report.pool_key.as_deref(),
        report.placed.rule.as_ref().unwrap().key.as_deref(),
        "the pool is the RLS bucket"
    );
    assert!(
        report.assignment.starts_with("a prepaid token bucket"),
        "{}",
        report.assignment
    );
    let text = report.to_text();
    assert!(
        text.starts_with("bucket id:   {route=export, tenant=acme}\n"),
        "{text}"
    );
    assert!(text.contains("pool key:    "), "{text}");

    let unlimited =
        explain_bucket(&config, "mesh", &[Entry::new("free", "x")], &options()).unwrap();
    assert!(
        unlimited.assignment.starts_with("ALLOW_ALL, standing"),
        "{}",
        unlimited.assignment
    );
    assert_eq!(unlimited.pool_key, None);

    let stray = [Entry::new("env", "prod"), Entry::new("tenant", "acme")];
    let missed = explain_bucket(&config, "mesh", &stray, &options()).unwrap();
    assert!(!missed.placed.matched);
    let reason = missed.placed.reason.unwrap();
    assert!(reason.contains("env fit no level"), "{reason}");

    let twice = [Entry::new("tenant", "a"), Entry::new("tenant", "b")];
    assert_eq!(
        explain_bucket(&config, "mesh", &twice, &options()).unwrap_err(),
        RepeatedKey("tenant".into())
    );
}

#[test]
fn a_quota_mode_rule_says_so() {
    let text = "domain: q
descriptors:
  - key: service
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3, lease: 2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 3}
";
    let config = load_sources(&[("q.yaml".into(), text.into())]).unwrap();
    let report = explain(
        &config,
        "q",
        &parse_descriptor("service=a").unwrap(),
        &options(),
    );
    let rule = report.rule.as_ref().unwrap();
    assert!(rule.quota && !rule.shadow);
    assert!(
        report.outcome.contains(
            "in quota mode: OVER_LIMIT here rejects the request only when every quota-mode descriptor of the request is over its limit"
        ) && report.outcome.contains("`lease` is ignored"),
        "{}",
        report.outcome
    );
    let text_report = report.to_text();
    assert!(
        text_report.contains("\nquota mode:  yes\n"),
        "{text_report}"
    );
    assert_eq!(
        serde_json::to_value(&report).unwrap()["rule"]["quota"],
        true
    );

    let plain = explain(
        &config,
        "q",
        &parse_descriptor("plain=a").unwrap(),
        &options(),
    );
    assert!(!plain.rule.as_ref().unwrap().quota);
    assert!(plain.to_text().contains("\nquota mode:  no\n"));
    assert!(!plain.outcome.contains("quota"), "{}", plain.outcome);
}

/// The keys `/buckets` reads are the ones explain names, with the shape each is decided with.
#[test]
fn stored_buckets_name_every_key_with_its_shape() {
    let text = "domain: s
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 10, shards: 2, algorithm: gcra}
  - key: free
    rate_limit: {unlimited: true}
";
    let config = load_sources(&[("s.yaml".into(), text.into())]).unwrap();
    let entries = parse_descriptor("hot=x").unwrap();
    let stored = stored_buckets(&config, "s", &entries, &options()).unwrap();
    assert_eq!(stored.rule.shard_keys.len(), 2);
    let keys: Vec<&str> = stored.keys.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, stored.rule.shard_keys);
    assert!(stored.keys.iter().all(|k| k.algorithm == Algorithm::Gcra));
    assert_eq!(stored.keys[1].shard, Some(1));
    assert_eq!(
        stored.keys[0].params.requests_per_unit, 5,
        "one shard's share"
    );

    // A bucket id's pool charges the unsharded key.
    let pool = stored_pool(&config, "s", &entries, &options()).unwrap();
    assert_eq!(pool.keys.len(), 1);
    assert_eq!(pool.keys[0].shard, None);
    assert_eq!(pool.keys[0].params.requests_per_unit, 10);

    let free = parse_descriptor("free=x").unwrap();
    assert!(matches!(
        stored_buckets(&config, "s", &free, &options()),
        Err(NotStored::NoBucket(_))
    ));
    let other = parse_descriptor("other=x").unwrap();
    assert!(matches!(
        stored_buckets(&config, "s", &other, &options()),
        Err(NotStored::NoRule(_))
    ));
    assert!(matches!(
        stored_buckets(&config, "nope", &entries, &options()),
        Err(NotStored::UnknownDomain(m)) if m.contains("configured domains: s")
    ));
    let twice = parse_descriptor("hot=x,hot=y").unwrap();
    assert!(matches!(
        stored_pool(&config, "s", &twice, &options()),
        Err(NotStored::RepeatedKey(_))
    ));
}

#[test]
fn a_multiplied_window_is_named_as_people_say_it() {
    let text = r#"domain: w
descriptors:
  - key: half
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 60}
  - key: five
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: fixed_window}
"#;
    let config = load_sources(&[("w.yaml".into(), text.into())]).unwrap();
    let report = |key: &str| explain(&config, "w", &[Entry::new(key, "x")], &options());
    let half = report("half");
    assert!(
        half.to_text().contains("limit:       60 per 30 seconds"),
        "{}",
        half.to_text()
    );
    let five = report("five");
    let text = five.to_text();
    assert!(text.contains("limit:       100 per 5 minutes"), "{text}");
    assert!(
        text.contains("window:      100 hits per 5 minutes aligned to the clock"),
        "{text}"
    );
    assert!(
        five.outcome
            .contains("the count starts again at the next 5-minute window on the clock"),
        "{}",
        five.outcome
    );
}

#[test]
fn an_always_charged_rule_says_so_with_its_origin() {
    let text = "domain: ai\ncharge: always\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: plain\n    charge: if_allowed\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let config = crate::config::load_sources(&[("ai.yaml".into(), text.into())]).unwrap();
    let options = options();
    let entries = [crate::request::Entry::new("tenant", "acme")];
    let e = explain(&config, "ai", &entries, &options);
    let rule = e.rule.as_ref().expect("a rule");
    assert_eq!((rule.charge, rule.charge_from), (Charge::Always, "domain"));
    assert!(
        e.to_text().contains("charge:      always (from domain)"),
        "{}",
        e.to_text()
    );
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["rule"]["charge"], "always");
    let plain = explain(
        &config,
        "ai",
        &[crate::request::Entry::new("plain", "x")],
        &options,
    );
    assert!(!plain.to_text().contains("charge:"), "{}", plain.to_text());
}

/// An in-flight cap's descriptor reaches its rule with or without the holder entry, and the
/// holder entry stays out of the storage key: one key per tenant.
#[test]
fn in_flight_caps_keep_the_holder_out_of_the_key() {
    let text = "domain: edge\ndescriptors:\n  - key: inflight\n    in_flight: {max: 2, holder: request_id, max_hold: 2s}\n";
    let config = load_sources(&[("edge.yaml".to_owned(), text.to_owned())]).unwrap();
    let options = options();
    let with = [
        Entry::new("inflight", "acme"),
        Entry::new("request_id", "r-1"),
    ];
    let report = explain(&config, "edge", &with, &options);
    assert!(report.matched, "{report:?}");
    let text = report.to_text();
    assert!(text.contains("limit:       2 in flight"), "{text}");
    assert!(
        text.contains("algorithm:   in_flight (from rule)"),
        "{text}"
    );
    assert!(text.contains("held by the `request_id` entry"), "{text}");
    assert!(
        text.contains("key:         sluice:{edge|inflight=acme}~if\n"),
        "{text}"
    );
    let without = explain(&config, "edge", &with[..1], &options);
    assert_eq!(
        without
            .to_text()
            .lines()
            .filter(|l| l.starts_with("key:"))
            .count(),
        1
    );
    assert!(without.to_text().contains("sluice:{edge|inflight=acme}~if"));
}

#[test]
fn reservations_keep_the_holder_out_of_the_key_and_say_how_they_settle() {
    let text = "domain: ai\ndescriptors:\n  - key: tenant\n    reserve: {holder: request_id, max_hold: 60s}\n    rate_limit: {unit: minute, requests_per_unit: 300}\n";
    let config = load_sources(&[("ai.yaml".to_owned(), text.to_owned())]).unwrap();
    let entries = [
        Entry::new("tenant", "acme"),
        Entry::new("request_id", "r-1"),
    ];
    let report = explain(&config, "ai", &entries, &options());
    assert!(report.matched, "{report:?}");
    let text = report.to_text();
    assert!(
        text.contains("reserve:     a `request_id` entry's first call reserves its hits"),
        "{text}"
    );
    assert!(text.contains("unsettled after 60000 ms"), "{text}");
    assert!(
        text.contains("key:         sluice:{ai|tenant=acme}\n"),
        "{text}"
    );
    assert!(
        text.lines()
            .filter(|l| l.starts_with("key:"))
            .all(|l| !l.contains("r-1")),
        "the holder is no part of the key: {text}"
    );
}
