//! Load options (merged domains, hidden files, global shadow mode) and warnings.

use super::*;

fn src(name: &str, text: &str) -> (String, String) {
    (name.to_owned(), text.to_owned())
}

fn errors(result: Result<Config, ConfigErrors>) -> Vec<String> {
    match result {
        Ok(_) => panic!("config loaded, expected errors"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

fn warnings(text: &str) -> Vec<String> {
    load_sources(&[src("t.yaml", text)])
        .expect("loads")
        .warnings()
        .iter()
        .map(ToString::to_string)
        .collect()
}

const A1: &str = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: one}\n";
const A2: &str =
    "domain: a\ndescriptors:\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

fn merging() -> LoadOptions {
    LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    }
}

#[test]
fn merged_files_add_to_one_domain_and_keep_their_own_sources() {
    let sources = [src("1.yaml", A1), src("2.yaml", A2)];
    assert_eq!(
        errors(load_sources(&sources)),
        ["2.yaml:1:9: duplicate domain `a`: already defined at 1.yaml:1:9"]
    );
    let config = load_sources_with(&sources, &merging()).unwrap();
    assert_eq!(config.domains().count(), 1);
    let domain = config.domain("a").unwrap();
    assert_eq!(domain.file(), "1.yaml");
    let k = domain.find(&[Entry::new("k", "v")]).unwrap();
    let j = domain.find(&[Entry::new("j", "v")]).unwrap();
    assert_eq!((&*k.source, &*j.source), ("1.yaml:3", "2.yaml:3"));
    assert_eq!(domain.rules().len(), 2);
}

#[test]
fn merging_rejects_clashes_across_files() {
    let clash = "domain: a\nfailure_mode: open\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: n\n    rate_limit: {unit: hour, requests_per_unit: 3, name: one}\n";
    let first = "domain: a\nfailure_mode: closed\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: one}\n";
    assert_eq!(
        errors(load_sources_with(
            &[src("1.yaml", first), src("2.yaml", clash)],
            &merging()
        )),
        [
            "2.yaml:1:9: domain `a` has failure_mode `open` here but `closed` in 1.yaml",
            "2.yaml:4:5: duplicate descriptor `k` in merged domain `a`: already defined at 1.yaml:4:5",
            "2.yaml:6:5: duplicate rate_limit name `one` in merged domain `a`: already used at 1.yaml:4:5",
        ]
    );
}

#[test]
fn shadow_all_puts_every_rule_in_shadow_mode() {
    let options = LoadOptions {
        shadow_all: true,
        ..LoadOptions::default()
    };
    let config = load_sources_with(&[src("a.yaml", A1)], &options).unwrap();
    assert!(config.rules().all(|r| r.shadow_mode));
    let plain = load_sources(&[src("a.yaml", A1)]).unwrap();
    assert!(!plain.rules().any(|r| r.shadow_mode));
}

/// envoyproxy/ratelimit's `quota_mode` sits on a descriptor beside `shadow_mode` and is carried to
/// its rule; it is a boolean like it.
#[test]
fn quota_mode_is_accepted_and_compiled_onto_its_rule() {
    let text = "domain: q
descriptors:
  - key: service
    value: one
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: two
    quota_mode: false
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: blocked
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
";
    let config = load_sources(&[src("q.yaml", text)]).unwrap();
    let quota: Vec<(&str, bool)> = config.rules().map(|r| (&*r.path, r.quota_mode)).collect();
    assert_eq!(
        quota,
        [
            ("q.service_one", true),
            ("q.service_two", false),
            ("q.plain", false),
            ("q.blocked", true),
        ]
    );
    let lines: Vec<usize> = config.warnings().iter().map(|w| w.line).collect();
    assert_eq!(lines, [15], "only the blocking rule's own warning");
    let bad = "domain: q\ndescriptors:\n  - key: k\n    quota_mode: often\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let found = errors(load_sources(&[src("q.yaml", bad)]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("q.yaml:4:17:") && found[0].contains("quota_mode"),
        "{found:?}"
    );
}

#[test]
fn quota_all_puts_every_rule_in_quota_mode() {
    let options = LoadOptions {
        quota_all: true,
        ..LoadOptions::default()
    };
    let config = load_sources_with(
        &[
            src("a.yaml", A1),
            src("b.yaml", A2.replace("domain: a", "domain: b").as_str()),
        ],
        &options,
    )
    .unwrap();
    assert!(config.rules().all(|r| r.quota_mode && !r.shadow_mode));
    let plain = load_sources(&[src("a.yaml", A1)]).unwrap();
    assert!(!plain.rules().any(|r| r.quota_mode));
}

/// A lease would pay a quota hit on its own, but whether it is taken depends on the request's
/// other quota descriptors: the limiter never leases one, and the loader says so.
#[test]
fn lease_on_a_quota_mode_rule_is_ignored_with_a_warning() {
    let text = "domain: q\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 10, lease: 5}\n";
    assert_eq!(
        warnings(text),
        [
            "t.yaml:5:55: `lease` is ignored on a quota-mode rule (`quota_mode: true`): whether its hit is taken depends on the request's other quota descriptors, so every hit goes to the backend"
        ]
    );
    let options = LoadOptions {
        quota_all: true,
        ..LoadOptions::default()
    };
    let leased = "domain: q\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10, lease: 5}\n";
    assert!(warnings(leased).is_empty());
    let config = load_sources_with(&[src("t.yaml", leased)], &options).unwrap();
    let found: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("(--quota-mode)"), "{found:?}");
}

#[test]
fn hidden_files_are_read_only_when_asked_and_kubelet_entries_never() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), A1).unwrap();
    std::fs::write(
        dir.path().join(".b.yaml"),
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("..c.yaml"), "not: [yaml").unwrap();
    let names = |options: &LoadOptions| -> Vec<String> {
        load_path_with(dir.path(), options)
            .unwrap()
            .domains()
            .map(|d| d.name.to_string())
            .collect()
    };
    assert_eq!(names(&LoadOptions::default()), ["a"]);
    let dotfiles = LoadOptions {
        dotfiles: true,
        ..LoadOptions::default()
    };
    assert_eq!(names(&dotfiles), ["b", "a"]);
}

#[test]
fn a_clean_config_has_no_warnings() {
    let config = load_sources(&[src("a.yaml", A1)]).unwrap();
    assert!(config.warnings().is_empty());
    assert_eq!(config.to_json()["warnings"], serde_json::json!([]));
}

#[test]
fn a_wildcard_behind_a_broader_earlier_one_is_reported() {
    let text = r#"domain: w
descriptors:
  - key: path
    value: "/api*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/api/v1*"
    rate_limit: {unit: second, requests_per_unit: 2}
    descriptors:
      - key: m
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: "/a"
    rate_limit: {unit: second, requests_per_unit: 3}
"#;
    assert_eq!(
        warnings(text),
        [
            "t.yaml:6:5: wildcard `path=/api/v1*` is never matched: the earlier wildcard `path=/api*` at line 3 matches every value it would (nor is anything under it)"
        ]
    );
    // Narrower first is fine: each wildcard gets the values the earlier ones leave.
    let ordered = text.replace("\"/api*\"", "\"/x\"");
    assert!(warnings(&ordered).is_empty(), "{:?}", warnings(&ordered));
}

#[test]
fn a_bare_key_behind_a_lone_star_is_reported() {
    let text = r#"domain: s
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 2}
"#;
    assert_eq!(
        warnings(text),
        [
            "t.yaml:3:5: descriptor `user` (any value) is never matched: the wildcard `user=*` at line 5 matches every value first"
        ]
    );
}

#[test]
fn dead_ends_dangling_replaces_and_shadowed_inner_stars_are_reported() {
    let text = r#"domain: d
descriptors:
  - key: a
    value: exempt
  - key: b
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces: [{name: nowhere}]
  - key: c
    value: "x*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: c
    value: "xa*y"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: c
    value: "y*z"
    rate_limit: {unit: second, requests_per_unit: 1}
"#;
    assert_eq!(
        warnings(text),
        [
            "t.yaml:3:5: descriptor `a=exempt` has no `rate_limit` and no `descriptors`: requests it matches are never limited (write `rate_limit: {unlimited: true}` to say so)",
            "t.yaml:5:5: `replaces` names `nowhere`, but no rate_limit of this domain has that name",
            "t.yaml:13:5: wildcard `c=xa*y` is never matched: the earlier wildcard `c=x*` at line 10 matches every value it would",
        ]
    );
}

#[test]
fn descriptors_deeper_than_a_request_can_be_are_reported() {
    let text = "domain: deep\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n            rate_limit: {unit: second, requests_per_unit: 1}\n";
    let options = LoadOptions {
        max_entries: 2,
        ..LoadOptions::default()
    };
    let config = load_sources_with(&[src("t.yaml", text)], &options).unwrap();
    let found: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        [
            "t.yaml:7:13: descriptor `c` is at depth 3, but a request descriptor carries at most 2 entries (--max-entries): it is never matched"
        ]
    );
    assert!(warnings(text).is_empty());
}

#[test]
fn merged_domains_are_linted_across_files() {
    let first = "domain: m\ndescriptors:\n  - key: p\n    value: \"*\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let second = "domain: m\ndescriptors:\n  - key: p\n    value: \"q*\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let config =
        load_sources_with(&[src("1.yaml", first), src("2.yaml", second)], &merging()).unwrap();
    let found: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        [
            "2.yaml:3:5: wildcard `p=q*` is never matched: the earlier wildcard `p=*` at 1.yaml:3 matches every value it would"
        ]
    );
}
