//! `rate_limit.algorithm`, a domain's `algorithm`, `--default-algorithm`, and the fields that
//! mean nothing for an algorithm.

use super::*;
use crate::rule::{Charge, Limit};

fn src(name: &str, text: &str) -> (String, String) {
    (name.to_owned(), text.to_owned())
}

fn with_default(default_algorithm: Algorithm) -> LoadOptions {
    LoadOptions {
        default_algorithm,
        ..LoadOptions::default()
    }
}

fn load_one(text: &str, options: &LoadOptions) -> Result<Config, ConfigErrors> {
    load_sources_with(&[src("t.yaml", text)], options)
}

fn errors(result: Result<Config, ConfigErrors>) -> Vec<String> {
    match result {
        Ok(_) => panic!("config loaded, expected errors"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

/// (algorithm, where it came from) of the rule `key=v` reaches.
fn algorithm_of(config: &Config, key: &str) -> (Algorithm, Origin) {
    let rule = config
        .domain("api")
        .unwrap()
        .find(&[Entry::new(key, "v")])
        .unwrap_or_else(|| panic!("no rule for {key}"));
    (rule.algorithm, rule.algorithm_from)
}

const MIXED: &str = r#"domain: api
algorithm: sliding_window
descriptors:
  - key: own
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: GCRA, burst: 5}
  - key: inherited
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 50}
"#;

#[test]
fn a_rules_algorithm_comes_from_itself_then_its_domain_then_the_default() {
    let config = load_one(MIXED, &LoadOptions::default()).unwrap();
    assert_eq!(
        algorithm_of(&config, "own"),
        (Algorithm::Gcra, Origin::Rule)
    );
    assert_eq!(
        algorithm_of(&config, "inherited"),
        (Algorithm::SlidingWindow, Origin::Domain)
    );
    assert_eq!(
        algorithm_of(&config, "bucket"),
        (Algorithm::TokenBucket, Origin::Rule)
    );
    let domain = config.domain("api").unwrap();
    assert_eq!(
        (domain.algorithm, domain.algorithm_from),
        (Algorithm::SlidingWindow, Origin::Domain)
    );

    let plain = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9}\n";
    for default in Algorithm::ALL {
        let config = load_one(plain, &with_default(default)).unwrap();
        assert_eq!(algorithm_of(&config, "k"), (default, Origin::Default));
        let domain = config.domain("api").unwrap();
        assert_eq!(
            (domain.algorithm, domain.algorithm_from),
            (default, Origin::Default)
        );
    }
    // Without any setting: the token bucket.
    let config = load_sources(&[src("t.yaml", plain)]).unwrap();
    assert_eq!(
        algorithm_of(&config, "k"),
        (Algorithm::TokenBucket, Origin::Default)
    );
}

#[test]
fn unknown_algorithms_are_located() {
    let text = "domain: api\nalgorithm: leaky_bucket\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9, algorithm: fixed-window}\n";
    assert_eq!(
        errors(load_one(text, &LoadOptions::default())),
        [
            "t.yaml:2:12: invalid algorithm `leaky_bucket`; expected one of: token_bucket, fixed_window, sliding_window, gcra",
            "t.yaml:5:63: invalid algorithm `fixed-window`; expected one of: token_bucket, fixed_window, sliding_window, gcra",
        ]
    );
}

#[test]
fn burst_is_refused_for_a_window_wherever_the_algorithm_comes_from() {
    let text = r#"domain: api
algorithm: fixed_window
descriptors:
  - key: inherited
    rate_limit: {unit: minute, requests_per_unit: 60, burst: 100}
  - key: own
    rate_limit:
      unit: minute
      requests_per_unit: 60
      algorithm: sliding_window
      burst: 100
  - key: fine
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: gcra, burst: 100}
"#;
    assert_eq!(
        errors(load_one(text, &LoadOptions::default())),
        [
            "t.yaml:5:55: `burst` does not apply to `fixed_window` (from the domain's `algorithm` at t.yaml:2:12): a window admits `requests_per_unit` per window; remove it, or use `token_bucket` or `gcra` for a burst",
            "t.yaml:11:7: `burst` does not apply to `sliding_window` (from its `algorithm`): a window admits `requests_per_unit` per window; remove it, or use `token_bucket` or `gcra` for a burst",
        ]
    );

    let defaulted = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9, burst: 20}\n";
    assert!(load_one(defaulted, &LoadOptions::default()).is_ok());
    assert!(load_one(defaulted, &with_default(Algorithm::Gcra)).is_ok());
    assert_eq!(
        errors(load_one(defaulted, &with_default(Algorithm::FixedWindow))),
        [
            "t.yaml:4:52: `burst` does not apply to `fixed_window` (from --default-algorithm): a window admits `requests_per_unit` per window; remove it, or use `token_bucket` or `gcra` for a burst"
        ]
    );
    // A rule's own algorithm wins over a window default.
    let own = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9, burst: 20, algorithm: token_bucket}\n";
    assert!(load_one(own, &with_default(Algorithm::SlidingWindow)).is_ok());
}

#[test]
fn unlimited_takes_no_algorithm() {
    let text = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, algorithm: gcra}\n";
    assert_eq!(
        errors(load_one(text, &LoadOptions::default())),
        ["t.yaml:4:35: `algorithm` must not be given with `unlimited: true`"]
    );
}

#[test]
fn merged_files_agree_on_the_domain_algorithm_and_share_it() {
    let merging = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let first = "domain: api\nalgorithm: fixed_window\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let second = "domain: api\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let config =
        load_sources_with(&[src("1.yaml", first), src("2.yaml", second)], &merging).unwrap();
    assert_eq!(
        algorithm_of(&config, "b"),
        (Algorithm::FixedWindow, Origin::Domain),
        "the domain's algorithm reaches the rules of its other files"
    );

    let bursty = "domain: api\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n";
    assert_eq!(
        errors(load_sources_with(
            &[src("1.yaml", first), src("2.yaml", bursty)],
            &merging
        )),
        [
            "2.yaml:4:54: `burst` does not apply to `fixed_window` (from the domain's `algorithm` at 1.yaml:2:12): a window admits `requests_per_unit` per window; remove it, or use `token_bucket` or `gcra` for a burst"
        ]
    );

    let other = "domain: api\nalgorithm: gcra\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    assert_eq!(
        errors(load_sources_with(
            &[src("1.yaml", first), src("2.yaml", other)],
            &merging
        )),
        ["2.yaml:2:12: domain `api` has algorithm `gcra` here but `fixed_window` in 1.yaml"]
    );
}

#[test]
fn the_config_dump_shows_each_rules_algorithm() {
    let json = load_one(MIXED, &LoadOptions::default()).unwrap().to_json();
    let domain = &json["domains"][0];
    assert_eq!(domain["algorithm"], "sliding_window");
    assert_eq!(domain["algorithm_from"], "domain");
    let rules = domain["rules"].as_array().unwrap();
    let shown: Vec<(&str, &str)> = rules
        .iter()
        .map(|r| {
            (
                r["algorithm"].as_str().unwrap(),
                r["algorithm_from"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("gcra", "rule"),
            ("sliding_window", "domain"),
            ("token_bucket", "rule")
        ]
    );
}

#[test]
fn lease_is_a_count_up_to_the_capacity_on_token_buckets_and_gcra() {
    let text = r#"domain: api
descriptors:
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 100, lease: 10}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 5, burst: 20, algorithm: gcra, lease: 20}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;
    let config = load_one(text, &LoadOptions::default()).unwrap();
    let lease_of = |key: &str| {
        config
            .domain("api")
            .unwrap()
            .find(&[Entry::new(key, "v")])
            .unwrap()
            .lease
    };
    assert_eq!(
        (lease_of("tb"), lease_of("g"), lease_of("plain")),
        (Some(10), Some(20), None)
    );
}

#[test]
fn lease_is_rejected_where_it_cannot_be_exact() {
    let text = r#"domain: api
descriptors:
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 100, lease: 0}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100, burst: 8, lease: 9}
  - key: free
    rate_limit: {unlimited: true, lease: 5}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window, lease: 5}
"#;
    assert_eq!(
        errors(load_one(text, &LoadOptions::default())),
        [
            "t.yaml:4:63: `lease` must be an integer from 1 to 4294967295, got 0",
            "t.yaml:6:73: `lease` (9) must not exceed the bucket's capacity (8, `burst` else `requests_per_unit`)",
            "t.yaml:8:35: `lease` must not be given with `unlimited: true`",
            "t.yaml:10:81: `lease` does not apply to `fixed_window` (from its `algorithm`): a token taken in one window could be spent in the next; use `token_bucket` or `gcra` to lease",
        ]
    );
    // From the domain's algorithm too.
    let domain_default = "domain: api\nalgorithm: sliding_window\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9, lease: 3}\n";
    let errs = errors(load_one(domain_default, &LoadOptions::default()));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].contains("`lease` does not apply to `sliding_window` (from the domain's `algorithm` at t.yaml:2:12)"),
        "{errs:?}"
    );
}

#[test]
fn shards_split_the_limit_into_whole_shards_on_every_algorithm() {
    let text = r#"domain: api
descriptors:
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 100, shards: 4}
  - key: bursty
    rate_limit: {unit: second, requests_per_unit: 10, burst: 40, shards: 2, lease: 20}
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: fixed_window, shards: 3}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 64, algorithm: sliding_window, shards: 64}
  - key: g
    cost: 4
    rate_limit: {unit: second, requests_per_unit: 8, burst: 16, algorithm: gcra, shards: 2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;
    let config = load_one(text, &LoadOptions::default()).unwrap();
    let rule = |key: &str| {
        config
            .domain("api")
            .unwrap()
            .find(&[Entry::new(key, "v")])
            .unwrap()
            .clone()
    };
    let shape = |key: &str| {
        let r = rule(key);
        let Limit::Bucket(rate) = r.limit else {
            panic!("{key} is limited")
        };
        let shard = rate.split(r.shards.unwrap_or(1));
        (r.shards, shard.requests_per_unit, shard.capacity())
    };
    assert_eq!(shape("tb"), (Some(4), 25, 25));
    assert_eq!(shape("bursty"), (Some(2), 5, 20));
    assert_eq!(shape("fw"), (Some(3), 20, 20));
    assert_eq!(shape("sw"), (Some(64), 1, 1));
    assert_eq!(shape("g"), (Some(2), 4, 8));
    assert_eq!(shape("plain"), (None, 100, 100));
    assert_eq!(rule("bursty").lease, Some(20));
    // The config dump shows it where it is set.
    let json = config.to_json();
    let rules = json["domains"][0]["rules"].as_array().unwrap();
    assert_eq!(rules[0]["shards"], 4);
    assert!(rules[5].get("shards").is_none());
}

#[test]
fn shards_are_rejected_where_the_limit_does_not_split() {
    let text = r#"domain: api
descriptors:
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 100, shards: 1}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 100, shards: 0}
  - key: many
    rate_limit: {unit: minute, requests_per_unit: 650, shards: 65}
  - key: free
    rate_limit: {unlimited: true, shards: 4}
  - key: rate
    rate_limit: {unit: minute, requests_per_unit: 10, shards: 4}
  - key: burst
    rate_limit: {unit: minute, requests_per_unit: 12, burst: 30, shards: 4}
  - key: leased
    rate_limit: {unit: minute, requests_per_unit: 100, lease: 30, shards: 4}
  - key: costly
    cost: 26
    rate_limit: {unit: minute, requests_per_unit: 100, shards: 4}
  - key: window
    cost: 21
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: fixed_window, shards: 3}
  - key: word
    rate_limit: {unit: minute, requests_per_unit: 100, shards: four}
"#;
    assert_eq!(
        errors(load_one(text, &LoadOptions::default())),
        [
            "t.yaml:4:64: `shards` must be an integer from 2 to 64, got 1",
            "t.yaml:6:64: `shards` must be an integer from 2 to 64, got 0",
            "t.yaml:8:64: `shards` must be an integer from 2 to 64, got 65",
            "t.yaml:10:35: `shards` must not be given with `unlimited: true`",
            "t.yaml:12:63: `shards` (4) must divide `requests_per_unit` (10) so that every shard gets a whole rate",
            "t.yaml:14:74: `shards` (4) must divide `burst` (30) so that every shard gets a whole capacity",
            "t.yaml:16:63: `lease` (30) must not exceed a shard's capacity (25: capacity 100 / `shards` 4): each shard leases on its own",
            "t.yaml:18:11: `cost` (26) must not exceed a shard's capacity (25: capacity 100 / `shards` 4): a request is judged by one shard, so every hit would be over limit",
            "t.yaml:21:11: `cost` (21) must not exceed a shard's capacity (20: capacity 60 / `shards` 3): a request is judged by one shard, so every hit would be over limit",
            "t.yaml:24:64: `shards` must be an integer, got `four`",
        ]
    );
    // A cost that fits a shard exactly is fine.
    let fits = "domain: api\ndescriptors:\n  - key: k\n    cost: 25\n    rate_limit: {unit: minute, requests_per_unit: 100, shards: 4}\n";
    assert!(load_one(fits, &LoadOptions::default()).is_ok());
}

#[test]
fn unit_multiplier_sets_the_window_for_every_algorithm() {
    let text = r#"domain: api
descriptors:
  - key: tb
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 60}
  - key: fw
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: fixed_window}
  - key: week
    rate_limit: {unit: day, unit_multiplier: 7, requests_per_unit: 10000, algorithm: gcra}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 3}
"#;
    let config = load_one(text, &LoadOptions::default()).unwrap();
    let rate = |key: &str| {
        let rule = config
            .domain("api")
            .unwrap()
            .find(&[Entry::new(key, "v")])
            .unwrap();
        match rule.limit {
            Limit::Bucket(rate) => rate,
            other => panic!("{key}: {other:?}"),
        }
    };
    assert_eq!(rate("tb").bucket().unit_ms, 30_000);
    assert_eq!(rate("tb").window().to_string(), "30 seconds");
    assert_eq!(rate("fw").bucket().unit_ms, 300_000);
    assert_eq!(rate("week").window_secs(), 7 * 86_400);
    assert_eq!(rate("plain").unit_multiplier, 1);
    assert_eq!(rate("plain").window().to_string(), "hour");
}

#[test]
fn unit_multiplier_is_a_positive_count_within_ten_years() {
    let text = r#"domain: api
descriptors:
  - key: zero
    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}
  - key: long
    rate_limit: {unit: year, unit_multiplier: 11, requests_per_unit: 1}
  - key: word
    rate_limit: {unit: second, unit_multiplier: thirty, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true, unit_multiplier: 2}
"#;
    let errs = errors(load_one(text, &LoadOptions::default()));
    let has = |needle: &str| errs.iter().any(|e| e.contains(needle));
    assert!(
        has("t.yaml:4:") && has("`unit_multiplier` must be an integer from 1"),
        "{errs:#?}"
    );
    assert!(
        has("t.yaml:6:") && has("the longest window is 315360000 s"),
        "{errs:#?}"
    );
    assert!(has("t.yaml:8:"), "{errs:#?}");
    assert!(
        has("`unit_multiplier` must not be given with `requests_per_unit: 0`"),
        "{errs:#?}"
    );
    assert!(
        has("`unit_multiplier` must not be given with `unlimited: true`"),
        "{errs:#?}"
    );
}

/// #190's own example: three limits on one key, each its own rule, window and key tag.
const SEVERAL: &str = r#"domain: api
descriptors:
  - key: tenant
    cost: 2
    rate_limits:
      - {unit: second, requests_per_unit: 5, name: per-second}
      - {unit: second, unit_multiplier: 30, requests_per_unit: 60}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: fixed_window}
"#;

#[test]
fn rate_limits_make_one_rule_per_limit_each_with_its_window() {
    let config = load_one(SEVERAL, &LoadOptions::default()).unwrap();
    let rule = config
        .domain("api")
        .unwrap()
        .find(&[Entry::new("tenant", "v")])
        .unwrap()
        .clone();
    let limits: Vec<_> = rule.limits().collect();
    assert_eq!(limits.len(), 3);
    type Summary<'a> = (String, Option<u64>, Algorithm, u64, Option<&'a str>);
    let summary: Vec<Summary<'_>> = limits
        .iter()
        .map(|r| {
            (
                r.path.to_string(),
                r.window_tag,
                r.algorithm,
                r.cost,
                r.name.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "api.tenant[1s]".into(),
                Some(1),
                Algorithm::TokenBucket,
                2,
                Some("per-second")
            ),
            (
                "api.tenant[30s]".into(),
                Some(30),
                Algorithm::TokenBucket,
                2,
                None
            ),
            (
                "api.tenant[5m]".into(),
                Some(300),
                Algorithm::FixedWindow,
                2,
                None
            ),
        ]
    );
    // Every limit is a rule of the config, numbered in config order.
    let ids: Vec<u32> = limits.iter().map(|r| r.id.0).collect();
    assert_eq!(ids, [0, 1, 2]);
    assert_eq!(config.rules().count(), 3);
}

#[test]
fn rate_limits_are_refused_where_they_cannot_mean_one_thing() {
    let text = r#"domain: api
descriptors:
  - key: both
    rate_limit: {unit: second, requests_per_unit: 1}
    rate_limits: [{unit: minute, requests_per_unit: 9}]
  - key: empty
    rate_limits: []
  - key: same_window
    rate_limits:
      - {unit: minute, requests_per_unit: 9}
      - {unit: second, unit_multiplier: 60, requests_per_unit: 10, algorithm: gcra}
  - key: single_only
    rate_limits:
      - {unit: minute, requests_per_unit: 9, shards: 3}
      - {unit: hour, requests_per_unit: 90, lease: 3}
      - {unit: day, requests_per_unit: 0}
      - {unlimited: true}
  - key: not_a_list
    rate_limits: {unit: minute, requests_per_unit: 9}
"#;
    let errs = errors(load_one(text, &LoadOptions::default()));
    let has = |needle: &str| errs.iter().any(|e| e.contains(needle));
    assert!(
        has("t.yaml:5:5: a descriptor has `rate_limit` or `rate_limits`, not both"),
        "{errs:#?}"
    );
    assert!(
        has("t.yaml:7:18: `rate_limits` must hold at least one limit"),
        "{errs:#?}"
    );
    assert!(
        has(
            "t.yaml:11:9: two limits of one descriptor with the same window (60 seconds; first at line 10)"
        ),
        "{errs:#?}"
    );
    assert!(
        has("`shards` applies to a single `rate_limit`"),
        "{errs:#?}"
    );
    assert!(has("`lease` applies to a single `rate_limit`"), "{errs:#?}");
    assert!(
        has("`unlimited` applies to a single `rate_limit`"),
        "{errs:#?}"
    );
    assert!(has("must not block (`requests_per_unit: 0`)"), "{errs:#?}");
    assert!(
        has("t.yaml:19:18: `rate_limits` must be a list"),
        "{errs:#?}"
    );
}

/// (charge, where it came from) of the rule `key=v` reaches.
fn charge_of(config: &Config, key: &str) -> (Charge, Origin) {
    let rule = config
        .domain("api")
        .unwrap()
        .find(&[Entry::new(key, "v")])
        .unwrap_or_else(|| panic!("no rule for {key}"));
    (rule.charge, rule.charge_from)
}

#[test]
fn a_rules_charge_comes_from_itself_then_its_domain_then_the_default() {
    let text = r#"domain: api
charge: always
descriptors:
  - key: own
    charge: IF_ALLOWED
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: inherited
    rate_limit: {unit: minute, requests_per_unit: 60}
"#;
    let config = load_one(text, &LoadOptions::default()).unwrap();
    assert_eq!(charge_of(&config, "own"), (Charge::IfAllowed, Origin::Rule));
    assert_eq!(
        charge_of(&config, "inherited"),
        (Charge::Always, Origin::Domain)
    );
    assert_eq!(config.domain("api").unwrap().charge, Charge::Always);
    let plain = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 60}\n";
    let always = LoadOptions {
        default_charge: Charge::Always,
        ..LoadOptions::default()
    };
    let config = load_one(plain, &always).unwrap();
    assert_eq!(charge_of(&config, "k"), (Charge::Always, Origin::Default));
    let config = load_one(plain, &LoadOptions::default()).unwrap();
    assert_eq!(
        charge_of(&config, "k"),
        (Charge::IfAllowed, Origin::Default)
    );
}

#[test]
fn charge_problems_are_located() {
    let text = r#"domain: api
charge: sometimes
descriptors:
  - key: node
    charge: always
    descriptors:
      - key: k
        charge: later
        rate_limit: {unit: minute, requests_per_unit: 60}
"#;
    assert_eq!(
        errors(load_one(text, &LoadOptions::default())),
        [
            "t.yaml:2:9: invalid charge `sometimes`; expected one of: if_allowed, always",
            "t.yaml:5:5: `charge` applies only to a descriptor with a `rate_limit` (it is not inherited)",
            "t.yaml:8:17: invalid charge `later`; expected one of: if_allowed, always",
        ]
    );
}

/// A leased hit is paid before the backend sees it: a rule whose charges always land cannot
/// lease, whichever level says `always`.
#[test]
fn lease_is_rejected_where_charges_always_land() {
    let own = r#"domain: api
descriptors:
  - key: k
    charge: always
    rate_limit: {unit: minute, requests_per_unit: 100, lease: 5}
"#;
    assert_eq!(
        errors(load_one(own, &LoadOptions::default())),
        [
            "t.yaml:5:56: `lease` does not apply to a rule whose charges always land (`charge: always`, from its `charge`): a leased hit is paid before the backend sees it, so a charge that does not fit could not be counted; remove `lease` or set `charge: if_allowed`"
        ]
    );
    let domain = "domain: api\ncharge: always\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100, lease: 5}\n";
    let errs = errors(load_one(domain, &LoadOptions::default()));
    assert!(
        errs.len() == 1 && errs[0].contains("from the domain's `charge` at t.yaml:2:9"),
        "{errs:?}"
    );
    let plain = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100, lease: 5}\n";
    let always = LoadOptions {
        default_charge: Charge::Always,
        ..LoadOptions::default()
    };
    let errs = errors(load_one(plain, &always));
    assert!(
        errs.len() == 1 && errs[0].contains("from --default-charge"),
        "{errs:?}"
    );
    // The rule's own `if_allowed` leases under any default.
    let opted_out = "domain: api\ncharge: always\ndescriptors:\n  - key: k\n    charge: if_allowed\n    rate_limit: {unit: minute, requests_per_unit: 100, lease: 5}\n";
    assert!(load_one(opted_out, &always).is_ok());
}

#[test]
fn merged_files_agree_on_the_charge() {
    let options = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let result = load_sources_with(
        &[
            src(
                "a.yaml",
                "domain: api\ncharge: always\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
            ),
            src(
                "b.yaml",
                "domain: api\ncharge: if_allowed\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
            ),
        ],
        &options,
    );
    assert_eq!(
        errors(result),
        ["b.yaml:2:9: domain `api` has charge `if_allowed` here but `always` in a.yaml"]
    );
}
