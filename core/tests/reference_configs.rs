//! envoyproxy/ratelimit's own config test suite, restated: a config of the shape of each of its
//! `test/config/` fixtures loads or is refused as the reference does it, and the lookups of its
//! wildcard tests reach the rules (and the stats paths) the reference reaches. The configs are
//! written here, not copied: each keeps only the construct its fixture tests.

use sluice_core::config::{Config, LoadOptions, load_sources, load_sources_with};
use sluice_core::request::Entry;

fn load(files: &[(&str, &str)]) -> Result<Config, String> {
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    load_sources(&sources).map_err(|e| e.to_string())
}

/// Refused, with a message containing `expected` (sluice's own words for the reference's error).
fn refused(files: &[(&str, &str)], expected: &str) {
    match load(files) {
        Ok(_) => panic!("loaded, but envoyproxy/ratelimit refuses it: {files:?}"),
        Err(e) => assert!(e.contains(expected), "expected `{expected}` in:\n{e}"),
    }
}

#[test]
fn every_config_the_reference_refuses_is_refused() {
    // bad_limit_unit: an unknown unit.
    refused(
        &[(
            "u.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
        )],
        "unit",
    );
    // bad_yaml: not YAML.
    refused(&[("y.yaml", "'''\n")], "y.yaml");
    // duplicate_domain: one domain in two files (without merging).
    refused(
        &[
            ("a.yaml", "domain: d\ndescriptors: []\n"),
            ("b.yaml", "domain: d\ndescriptors: []\n"),
        ],
        "domain",
    );
    // duplicate_key: one key and value twice at one level.
    refused(
        &[(
            "k.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
        )],
        "duplicate descriptor",
    );
    // empty_domain: no domain.
    refused(&[("e.yaml", "descriptors: []\n")], "domain");
    // empty_key: a descriptor without key.
    refused(
        &[("e.yaml", "domain: d\ndescriptors:\n  - value: v\n")],
        "key",
    );
    // misspelled_key / misspelled_key2: names neither project knows.
    refused(
        &[(
            "m.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: day, requests_per_unit: 5}\n",
        )],
        "unknown field `ratelimit`",
    );
    refused(
        &[(
            "m.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requestsperunit: 5}\n",
        )],
        "unknown field `requestsperunit`",
    );
    // non_map_list: descriptors that are not mappings.
    refused(&[("n.yaml", "domain: d\ndescriptors: [a, b]\n")], "mapping");
    // non_string_key: a number as a field name.
    refused(
        &[("n.yaml", "0.25: d\ndescriptors: []\n")],
        "unknown field `0.25`",
    );
    // replaces_empty / replaces_self.
    refused(
        &[(
            "r.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces: [{name: }]\n      unit: second\n      requests_per_unit: 5\n",
        )],
        "replaces",
    );
    refused(
        &[(
            "r.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: self\n      replaces: [{name: self}]\n      unit: second\n      requests_per_unit: 5\n",
        )],
        "cannot replace itself",
    );
    // unlimited_with_unit.
    refused(
        &[(
            "u.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}\n",
        )],
        "unlimited",
    );
}

#[test]
fn merged_files_of_one_domain_load_and_a_repeated_key_is_still_refused() {
    let one = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let two = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let merging = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let src = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    };
    let config = load_sources_with(&src(&[("1.yaml", one), ("2.yaml", two)]), &merging).unwrap();
    let domain = config.domain("d").unwrap();
    assert!(domain.find(&[Entry::new("a", "x")]).is_some());
    assert!(domain.find(&[Entry::new("b", "x")]).is_some());
    // TestDuplicateKeyDomainMerge: the same file twice repeats its keys.
    assert!(load_sources_with(&src(&[("1.yaml", one), ("1b.yaml", one)]), &merging).is_err());
}

/// The shape of the reference's wildcard fixture.
const WILDCARDS: &str = "domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
";

#[test]
fn wildcard_lookups_reach_what_the_reference_reaches() {
    let config = load(&[("w.yaml", WILDCARDS)]).unwrap();
    let domain = config.domain("test-domain").unwrap();
    let path = |pairs: &[(&str, &str)]| {
        let entries: Vec<Entry> = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
        domain.find(&entries).map(|r| r.path.to_string())
    };
    for (pairs, expected) in [
        (&[("noVal", "foo1")][..], Some("test-domain.noVal")),
        (&[("noVal", "foo2")][..], Some("test-domain.noVal")),
        (&[("wild", "foo1")][..], Some("test-domain.wild_foo*")),
        (&[("wild", "foo2")][..], Some("test-domain.wild_foo*")),
        (
            &[("nestedWild", "val1"), ("wild", "goo2")][..],
            Some("test-domain.nestedWild_val1.wild_goo*"),
        ),
        (&[("wild", "bar")][..], None),
        (&[("noWild", "foo1")][..], None),
        (
            &[("midWild", "barab")][..],
            Some("test-domain.midWild_bar*b"),
        ),
        (
            &[("midWild", "bar123b")][..],
            Some("test-domain.midWild_bar*b"),
        ),
        (
            &[("midWild", "barb")][..],
            Some("test-domain.midWild_bar*b"),
        ),
        (&[("midWild", "bara")][..], None),
        (&[("midWild", "xbarb")][..], None),
        (
            &[("multiWild", "foo123bar456baz")][..],
            Some("test-domain.multiWild_foo*bar*baz"),
        ),
        (
            &[("multiWild", "foobarbaz")][..],
            Some("test-domain.multiWild_foo*bar*baz"),
        ),
        (&[("multiWild", "foo123baz")][..], None),
        (&[("multiWild", "bar456baz")][..], None),
    ] {
        assert_eq!(path(pairs).as_deref(), expected, "{pairs:?}");
    }
}
