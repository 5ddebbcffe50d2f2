use super::*;
use crate::algorithm::Algorithm;
use crate::rule::{Limit, Origin, RateLimit, RuleId, Unit};

fn rule(id: u32, path: &str) -> Arc<Rule> {
    Arc::new(Rule {
        id: RuleId(id),
        domain: "d".into(),
        path: path.into(),
        name: None,
        limit: Limit::Bucket(RateLimit {
            requests_per_unit: 1,
            unit: Unit::Second,
            unit_multiplier: 1,
            burst: None,
        }),
        algorithm: Algorithm::TokenBucket,
        algorithm_from: Origin::Default,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        cost: 1,
        charge: crate::rule::Charge::IfAllowed,
        charge_from: Origin::Default,
        lease: None,
        shards: None,
        in_flight: None,
        reserve: None,
        failure_mode: None,
        replaces: Vec::new(),
        shared_values: Arc::default(),
        metric_levels: Arc::default(),
        metadata: None,
        source: "t:1".into(),
        window_tag: None,
        also: Arc::default(),
    })
}

fn leaf(id: u32, path: &str) -> Node {
    Node::new(Some(rule(id, path)), Level::default())
}

fn found(level: &Level, entries: &[(&str, &str)]) -> Option<String> {
    let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    level.find(&entries).map(|r| r.path.to_string())
}

#[test]
fn every_star_is_a_wildcard_and_a_lone_trailing_one_a_prefix() {
    assert_eq!(Pattern::parse(None), Pattern::Any);
    assert_eq!(Pattern::parse(Some("a")), Pattern::Exact("a"));
    assert_eq!(Pattern::parse(Some("a*")), Pattern::Prefix("a"));
    assert_eq!(Pattern::parse(Some("*")), Pattern::Prefix(""));
    assert_eq!(Pattern::parse(Some("a*b")), Pattern::Glob("a*b"));
    assert_eq!(Pattern::parse(Some("a**")), Pattern::Glob("a**"));
    assert_eq!(Pattern::parse(Some("*a*")), Pattern::Glob("*a*"));
}

fn glob(pattern: &str, value: &str) -> bool {
    let Some(w) = Wildcard::new(Pattern::parse(Some(pattern))) else {
        return pattern == value;
    };
    w.matches(value.as_bytes())
}

#[test]
fn each_star_matches_zero_or_more_characters_in_order() {
    for (pattern, value, expected) in [
        ("bar*b", "barb", true),
        ("bar*b", "bar-xyz-b", true),
        ("bar*b", "bar", false),
        ("bar*b", "barbx", false),
        ("foo*bar*baz", "foobarbaz", true),
        ("foo*bar*baz", "foo1bar2baz", true),
        ("foo*bar*baz", "foobazbar", false),
        ("/api*v1", "/api/users/v1", true),
        ("/api*v1", "/api/users/v2", false),
        ("svc*ep*rpc", "svc.users.ep.get.rpc", true),
        ("svc*ep*rpc", "svcXXrpc", false),
        // Parts may not overlap: "aba" is not "ab" then "ba".
        ("ab*ba", "aba", false),
        ("ab*ba", "abba", true),
        ("a*a", "a", false),
        ("*a*", "a", true),
        ("*a*", "xyz", false),
        ("a**b", "ab", true),
        ("*", "", true),
        ("x*", "x", true),
    ] {
        assert_eq!(glob(pattern, value), expected, "{pattern} vs {value}");
    }
}

#[test]
fn exact_then_first_wildcard_then_bare() {
    let mut top = Level::default();
    top.insert("k", Pattern::Any, leaf(0, "bare")).unwrap();
    top.insert("k", Pattern::Prefix("ab"), leaf(1, "ab*"))
        .unwrap();
    top.insert("k", Pattern::Prefix("a"), leaf(2, "a*"))
        .unwrap();
    top.insert("k", Pattern::Exact("abc"), leaf(3, "abc"))
        .unwrap();
    assert_eq!(found(&top, &[("k", "abc")]).as_deref(), Some("abc"));
    // "ab*" comes first in config order, although "a*" also matches.
    assert_eq!(found(&top, &[("k", "abd")]).as_deref(), Some("ab*"));
    assert_eq!(found(&top, &[("k", "ax")]).as_deref(), Some("a*"));
    assert_eq!(found(&top, &[("k", "zz")]).as_deref(), Some("bare"));
    assert_eq!(found(&top, &[("other", "abc")]), None);
    assert_eq!(found(&top, &[]), None);
}

#[test]
fn values_that_are_not_utf8_match_byte_wise() {
    let mut top = Level::default();
    top.insert("k", Pattern::Any, leaf(0, "bare")).unwrap();
    top.insert("k", Pattern::Exact("abc\u{FFFD}"), leaf(1, "exact"))
        .unwrap();
    top.insert("k", Pattern::Glob("*\u{FFFD}*z"), leaf(2, "glob"))
        .unwrap();
    top.insert("k", Pattern::Prefix("abc"), leaf(3, "abc*"))
        .unwrap();
    let find = |value: &[u8]| {
        top.find(&[Entry::new("k", value)])
            .map(|r| r.path.to_string())
    };
    assert_eq!(
        find(b"abc\xff").as_deref(),
        Some("abc*"),
        "not the lossy exact value"
    );
    assert_eq!(find("abc\u{FFFD}".as_bytes()).as_deref(), Some("exact"));
    assert_eq!(
        find(b"x\xffz").as_deref(),
        Some("bare"),
        "0xFF is not U+FFFD"
    );
    assert_eq!(find("x\u{FFFD}yz".as_bytes()).as_deref(), Some("glob"));
    assert_eq!(find(b"ab\xffc").as_deref(), Some("bare"));
    let e_acute = Wildcard::new(Pattern::Glob("a*\u{e9}")).unwrap();
    assert!(e_acute.matches("ab\u{e9}".as_bytes()));
    assert!(
        !e_acute.matches(b"ab\xc3"),
        "half of a character is not the character"
    );
}

#[test]
fn wildcards_match_in_config_order() {
    let mut top = Level::default();
    top.insert("k", Pattern::Prefix("a"), leaf(0, "a*"))
        .unwrap();
    top.insert("k", Pattern::Prefix("ab"), leaf(1, "ab*"))
        .unwrap();
    // The broader wildcard, listed first, shadows the narrower one.
    assert_eq!(found(&top, &[("k", "abc")]).as_deref(), Some("a*"));
}

#[test]
fn lone_star_matches_every_value_before_the_bare_key() {
    let mut top = Level::default();
    top.insert("k", Pattern::Any, leaf(0, "bare")).unwrap();
    top.insert("k", Pattern::Prefix(""), leaf(1, "star"))
        .unwrap();
    assert_eq!(found(&top, &[("k", "anything")]).as_deref(), Some("star"));
    assert_eq!(found(&top, &[("k", "")]).as_deref(), Some("star"));
}

#[test]
fn depth_must_match_both_ways() {
    let mut children = Level::default();
    children.insert("b", Pattern::Any, leaf(1, "a.b")).unwrap();
    let mut top = Level::default();
    top.insert("a", Pattern::Any, Node::new(Some(rule(0, "a")), children))
        .unwrap();
    top.insert("x", Pattern::Any, leaf(2, "x")).unwrap();
    assert_eq!(found(&top, &[("a", "1")]).as_deref(), Some("a"));
    assert_eq!(
        found(&top, &[("a", "1"), ("b", "2")]).as_deref(),
        Some("a.b")
    );
    // Request deeper than the config.
    assert_eq!(found(&top, &[("a", "1"), ("b", "2"), ("c", "3")]), None);
    assert_eq!(found(&top, &[("x", "1"), ("b", "2")]), None);
    // Rule deeper than the request: a pure tree node has no rule of its own.
    let mut inner = Level::default();
    inner.insert("b", Pattern::Any, leaf(3, "p.b")).unwrap();
    let mut top = Level::default();
    top.insert("p", Pattern::Any, Node::new(None, inner))
        .unwrap();
    assert_eq!(found(&top, &[("p", "1")]), None);
    assert_eq!(
        found(&top, &[("p", "1"), ("b", "2")]).as_deref(),
        Some("p.b")
    );
}

#[test]
fn no_backtracking_to_a_less_specific_node() {
    let mut children = Level::default();
    children.insert("b", Pattern::Any, leaf(1, "a.b")).unwrap();
    let mut top = Level::default();
    top.insert("a", Pattern::Exact("v"), leaf(0, "a_v"))
        .unwrap();
    top.insert("a", Pattern::Any, Node::new(None, children))
        .unwrap();
    assert_eq!(
        found(&top, &[("a", "w"), ("b", "1")]).as_deref(),
        Some("a.b")
    );
    // The exact node wins at level one and has no children, so the walk ends there.
    assert_eq!(found(&top, &[("a", "v"), ("b", "1")]), None);
}

#[test]
fn duplicates_are_refused() {
    let mut top = Level::default();
    top.insert("k", Pattern::Any, leaf(0, "a")).unwrap();
    top.insert("k", Pattern::Exact("v"), leaf(1, "b")).unwrap();
    top.insert("k", Pattern::Prefix("v"), leaf(2, "c")).unwrap();
    assert_eq!(top.insert("k", Pattern::Any, leaf(3, "d")), Err(Duplicate));
    assert_eq!(
        top.insert("k", Pattern::Exact("v"), leaf(4, "e")),
        Err(Duplicate)
    );
    assert_eq!(
        top.insert("k", Pattern::Prefix("v"), leaf(5, "f")),
        Err(Duplicate)
    );
}

fn explained(level: &Level, entries: &[(&str, &str)]) -> Explanation {
    let entries: Vec<Entry> = entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    level.explain(&entries)
}

#[test]
fn explain_names_each_step_and_the_reason_for_a_miss() {
    let mut inner = Level::default();
    inner.insert("b", Pattern::Any, leaf(1, "a.b")).unwrap();
    let mut top = Level::default();
    top.insert("a", Pattern::Prefix("x"), Node::new(None, inner))
        .unwrap();
    top.insert("a", Pattern::Exact("leaf"), leaf(2, "a_leaf"))
        .unwrap();
    top.insert("z", Pattern::Any, leaf(3, "z")).unwrap();

    let hit = explained(&top, &[("a", "xy"), ("b", "1")]);
    assert_eq!(hit.rule().map(|r| &*r.path), Some("a.b"));
    assert_eq!(
        hit.steps,
        [
            Step {
                index: 0,
                selected: Selected::Wildcard("x*".into())
            },
            Step {
                index: 1,
                selected: Selected::AnyValue
            }
        ]
    );
    assert_eq!(explained(&top, &[]).outcome, Err(Miss::NoEntries));
    assert_eq!(
        explained(&top, &[("q", "1")]).outcome,
        Err(Miss::NoMatch {
            index: 0,
            keys: vec!["a".into(), "z".into()]
        })
    );
    assert_eq!(
        explained(&top, &[("a", "xy"), ("c", "1")]).outcome,
        Err(Miss::NoMatch {
            index: 1,
            keys: vec!["b".into()]
        })
    );
    assert_eq!(
        explained(&top, &[("a", "xy")]).outcome,
        Err(Miss::NoRule {
            index: 0,
            keys: vec!["b".into()]
        })
    );
    let deeper = explained(&top, &[("a", "leaf"), ("b", "1")]);
    assert_eq!(deeper.outcome, Err(Miss::RequestDeeper { index: 0 }));
    assert_eq!(deeper.steps[0].selected, Selected::Exact);
}

mod agreement {
    use proptest::prelude::*;

    use super::*;

    const KEYS: [&str; 2] = ["a", "b"];
    const PATTERNS: [Option<&str>; 7] = [
        None,
        Some("x"),
        Some("xy"),
        Some("x*"),
        Some("*"),
        Some("x*z"),
        Some("*y*"),
    ];
    const VALUES: [&str; 4] = ["x", "xy", "xyz", "q"];

    /// A descriptor tree as plain data: (key, pattern, has a rule, children).
    #[derive(Clone, Debug)]
    struct Spec(usize, usize, bool, Vec<Spec>);

    fn spec() -> impl Strategy<Value = Vec<Spec>> {
        let leaf = (0..KEYS.len(), 0..PATTERNS.len(), any::<bool>())
            .prop_map(|(k, p, r)| Spec(k, p, r, Vec::new()));
        let tree = leaf.prop_recursive(3, 24, 4, |inner| {
            (
                0..KEYS.len(),
                0..PATTERNS.len(),
                any::<bool>(),
                prop::collection::vec(inner, 0..4),
            )
                .prop_map(|(k, p, r, c)| Spec(k, p, r, c))
        });
        prop::collection::vec(tree, 0..5)
    }

    fn build(specs: &[Spec], next_id: &mut u32) -> Level {
        let mut level = Level::default();
        for Spec(k, p, has_rule, children) in specs {
            let rule = has_rule.then(|| {
                *next_id += 1;
                rule(*next_id, &next_id.to_string())
            });
            let node = Node::new(rule, build(children, next_id));
            // Duplicates at one level are a validation error; generated ones are dropped.
            let _ = level.insert(KEYS[*k], Pattern::parse(PATTERNS[*p]), node);
        }
        level
    }

    /// The textbook definition of `*` matching, by dynamic programming over bytes.
    fn model(pattern: &[u8], value: &[u8]) -> bool {
        let mut row = vec![false; value.len() + 1];
        row[0] = true;
        for &p in pattern {
            let mut next = vec![false; value.len() + 1];
            if p == b'*' {
                let mut any = false;
                for j in 0..=value.len() {
                    any |= row[j];
                    next[j] = any;
                }
            } else {
                for j in 1..=value.len() {
                    next[j] = row[j - 1] && value[j - 1] == p;
                }
            }
            row = next;
        }
        row[value.len()]
    }

    proptest! {
        #[test]
        fn wildcards_agree_with_the_textbook_definition(
            pattern in "[ab*]{0,7}",
            value in "[ab]{0,8}",
        ) {
            let expected = model(pattern.as_bytes(), value.as_bytes());
            let got = match Wildcard::new(Pattern::parse(Some(&pattern))) {
                Some(w) => w.matches(value.as_bytes()),
                None => pattern == value,
            };
            prop_assert_eq!(got, expected);
        }

        #[test]
        fn explain_reaches_the_rule_find_reaches(
            specs in spec(),
            request in prop::collection::vec((0..KEYS.len(), 0..VALUES.len()), 0..4),
        ) {
            let level = build(&specs, &mut 0);
            let entries: Vec<Entry> = request
                .iter()
                .map(|(k, v)| Entry::new(KEYS[*k], VALUES[*v]))
                .collect();
            let explanation = level.explain(&entries);
            prop_assert_eq!(
                explanation.rule().map(|r| r.id),
                level.find(&entries).map(|r| r.id)
            );
            if explanation.rule().is_some() {
                prop_assert_eq!(explanation.steps.len(), entries.len());
            }
        }
    }
}
