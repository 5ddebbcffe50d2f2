//! The compiled descriptor tree of one domain: request entries → the rule they reach.
//!
//! Built once per config load. A lookup walks one level per request entry with hash lookups keyed
//! by the request's own `&str`s, so it allocates nothing. Configured values are UTF-8; request
//! values are bytes and match byte-wise: a value that is not UTF-8 equals no exact value and may
//! match a wildcard (`abc\xff` matches `abc*`).
//!
//! Matching is envoyproxy/ratelimit's: at each level try the exact `key`+`value` node, else the
//! first wildcard node of that key (config order) whose pattern matches the value, else the
//! bare-key node. In a wildcard every `*` matches zero or more characters, in order (`a*`, `*`,
//! `bar*b`, `foo*bar*baz`); the common shapes stay cheap: an exact value is a hash lookup and a
//! trailing `*` a prefix test. A node's rule applies only when the request's last entry lands on it; a node reached
//! earlier leads on through its children, and a node without children ends the walk with no
//! match. There is no backtracking: a more specific node that leads nowhere hides a less specific
//! one that would have.

use std::collections::HashMap;
use std::sync::Arc;

use crate::request::Entry;
use crate::rule::Rule;

/// How a configured descriptor's `value` matches a request value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern<'a> {
    /// No `value`: any value.
    Any,
    /// A literal value.
    Exact(&'a str),
    /// A value whose only `*` is its last character: any value starting with the part before it
    /// (`*` alone: any value, tried before the bare key).
    Prefix(&'a str),
    /// Any other value holding a `*` (the whole configured value): each `*` matches zero or more
    /// characters, the literal parts between them appear in order.
    Glob(&'a str),
}

impl<'a> Pattern<'a> {
    /// Reads a configured value.
    pub fn parse(value: Option<&'a str>) -> Pattern<'a> {
        match value {
            None => Pattern::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) if !prefix.contains('*') => Pattern::Prefix(prefix),
                _ if v.contains('*') => Pattern::Glob(v),
                _ => Pattern::Exact(v),
            },
        }
    }
}

/// A compiled wildcard value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Wildcard {
    /// The part before a single trailing `*`.
    Prefix(Box<str>),
    /// The configured value and its literal parts, split on `*` once at load.
    Glob {
        text: Box<str>,
        parts: Box<[Box<str>]>,
    },
}

impl Wildcard {
    fn new(pattern: Pattern<'_>) -> Option<Wildcard> {
        match pattern {
            Pattern::Prefix(prefix) => Some(Wildcard::Prefix(prefix.into())),
            Pattern::Glob(text) => Some(Wildcard::Glob {
                text: text.into(),
                parts: text.split('*').map(Box::from).collect(),
            }),
            Pattern::Any | Pattern::Exact(_) => None,
        }
    }

    /// The configured value, `*`s included.
    fn text(&self) -> String {
        match self {
            Wildcard::Prefix(prefix) => format!("{prefix}*"),
            Wildcard::Glob { text, .. } => text.to_string(),
        }
    }

    /// Byte-wise: a value need not be UTF-8 (`abc\xff` matches `abc*`).
    fn matches(&self, value: &[u8]) -> bool {
        match self {
            Wildcard::Prefix(prefix) => value.starts_with(prefix.as_bytes()),
            Wildcard::Glob { parts, .. } => glob_matches(parts, value),
        }
    }
}

/// Whether `value` matches the literal `parts` of a pattern split on `*` (at least two parts):
/// it starts with the first, ends with the last, and holds the middle ones in order, none of them
/// overlapping another. Greedy leftmost placement of each middle part is enough: placing a part
/// earlier never leaves less room for the parts after it.
fn glob_matches(parts: &[Box<str>], value: &[u8]) -> bool {
    let (Some((first, rest)), Some(last)) = (parts.split_first(), parts.last()) else {
        return false;
    };
    let Some(middle) = rest.split_last().map(|(_, middle)| middle) else {
        return first.as_bytes() == value;
    };
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    if value.len() < fixed
        || !value.starts_with(first.as_bytes())
        || !value.ends_with(last.as_bytes())
    {
        return false;
    }
    let mut inner = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match find(inner, part.as_bytes()) {
            Some(at) => inner = &inner[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Where `needle` first occurs in `haystack` (an empty needle: at 0).
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The sibling descriptors under one parent (or at the top of a domain).
#[derive(Debug, Default)]
pub struct Level {
    keys: HashMap<Box<str>, KeyNodes>,
}

/// The nodes of one key at one level, in match order.
#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<Box<str>, Node>,
    /// Wildcard values and their nodes, in config order.
    wildcards: Vec<(Wildcard, Node)>,
    bare: Option<Node>,
}

/// One configured descriptor.
#[derive(Debug, Default)]
pub struct Node {
    rule: Option<Arc<Rule>>,
    children: Level,
}

/// Two configured descriptors with the same key and value at one level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("duplicate descriptor at one level")]
pub struct Duplicate;

impl Node {
    pub fn new(rule: Option<Arc<Rule>>, children: Level) -> Node {
        Node { rule, children }
    }

    pub fn rule(&self) -> Option<&Arc<Rule>> {
        self.rule.as_ref()
    }

    pub fn children(&self) -> &Level {
        &self.children
    }
}

impl Level {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Adds a node; wildcards keep the order they are added in.
    pub fn insert(&mut self, key: &str, pattern: Pattern<'_>, node: Node) -> Result<(), Duplicate> {
        let nodes = self.keys.entry(key.into()).or_default();
        match pattern {
            Pattern::Any if nodes.bare.is_some() => return Err(Duplicate),
            Pattern::Any => nodes.bare = Some(node),
            Pattern::Exact(value) if nodes.exact.contains_key(value) => return Err(Duplicate),
            Pattern::Exact(value) => {
                nodes.exact.insert(value.into(), node);
            }
            Pattern::Prefix(_) | Pattern::Glob(_) => {
                let wildcard = Wildcard::new(pattern).expect("a wildcard pattern");
                if nodes.wildcards.iter().any(|(w, _)| *w == wildcard) {
                    return Err(Duplicate);
                }
                nodes.wildcards.push((wildcard, node));
            }
        }
        Ok(())
    }

    /// The node one entry selects at this level.
    pub fn select(&self, entry: &Entry) -> Option<&Node> {
        let nodes = self.keys.get(entry.key.as_str())?;
        // Configured values are UTF-8: a value that is not equals none of them.
        let value = &entry.value;
        value
            .as_str()
            .and_then(|v| nodes.exact.get(v))
            .or_else(|| {
                nodes
                    .wildcards
                    .iter()
                    .find(|(wildcard, _)| wildcard.matches(value.as_bytes()))
                    .map(|(_, node)| node)
            })
            .or(nodes.bare.as_ref())
    }

    /// The rule a request descriptor's entries reach from this level, if any.
    pub fn find(&self, entries: &[Entry]) -> Option<&Arc<Rule>> {
        let (last, path) = entries.split_last()?;
        let mut level = self;
        for entry in path {
            let node = level.select(entry)?;
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        level.select(last)?.rule.as_ref()
    }
}

/// How one request entry selected a configured descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    /// The descriptor with exactly this value.
    Exact,
    /// The first wildcard (in config order) that matches the value; holds the configured
    /// value, `*`s included.
    Wildcard(String),
    /// The descriptor with the key and no value.
    AnyValue,
}

/// One entry's step down the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Index of the request entry.
    pub index: usize,
    pub selected: Selected,
}

/// Why a request descriptor reaches no rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The request descriptor has no entries.
    NoEntries,
    /// Entry `index` matches no descriptor at its level; `keys` are the keys configured there.
    NoMatch { index: usize, keys: Vec<String> },
    /// Entry `index` reached a descriptor with no nested descriptors, but more entries follow.
    RequestDeeper { index: usize },
    /// The last entry (`index`) reached a descriptor without a `rate_limit` of its own; `keys`
    /// are the keys nested under it, which a longer request would reach.
    NoRule { index: usize, keys: Vec<String> },
}

/// The walk [`Level::find`] makes, step by step, and where it ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    pub steps: Vec<Step>,
    pub outcome: Result<Arc<Rule>, Miss>,
}

impl Explanation {
    pub fn rule(&self) -> Option<&Arc<Rule>> {
        self.outcome.as_ref().ok()
    }
}

impl Level {
    /// Configured keys at this level, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.keys.keys().map(|k| k.to_string()).collect();
        keys.sort_unstable();
        keys
    }

    /// [`Level::select`], also saying how the node was chosen.
    fn select_explained(&self, entry: &Entry) -> Option<(&Node, Selected)> {
        let nodes = self.keys.get(entry.key.as_str())?;
        if let Some(node) = entry.value.as_str().and_then(|v| nodes.exact.get(v)) {
            return Some((node, Selected::Exact));
        }
        if let Some((wildcard, node)) = nodes
            .wildcards
            .iter()
            .find(|(wildcard, _)| wildcard.matches(entry.value.as_bytes()))
        {
            return Some((node, Selected::Wildcard(wildcard.text())));
        }
        nodes.bare.as_ref().map(|node| (node, Selected::AnyValue))
    }

    /// The same walk as [`Level::find`], recorded for operators (`sluice explain`, `GET /explain`).
    /// Off the request path, so it may allocate.
    pub fn explain(&self, entries: &[Entry]) -> Explanation {
        let mut steps = Vec::with_capacity(entries.len());
        let miss = |steps, miss| Explanation {
            steps,
            outcome: Err(miss),
        };
        if entries.is_empty() {
            return miss(steps, Miss::NoEntries);
        }
        let mut level = self;
        for (index, entry) in entries.iter().enumerate() {
            let Some((node, selected)) = level.select_explained(entry) else {
                let keys = level.keys();
                return miss(steps, Miss::NoMatch { index, keys });
            };
            steps.push(Step { index, selected });
            let last = index + 1 == entries.len();
            if last {
                return match &node.rule {
                    Some(rule) => Explanation {
                        steps,
                        outcome: Ok(rule.clone()),
                    },
                    None => {
                        let keys = node.children.keys();
                        miss(steps, Miss::NoRule { index, keys })
                    }
                };
            }
            if node.children.is_empty() {
                return miss(steps, Miss::RequestDeeper { index });
            }
            level = &node.children;
        }
        unreachable!("the last entry returns inside the loop")
    }
}

/// Why an RLQS bucket id reaches no rule ([`Level::place`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unplaced {
    /// Some entries could not all be placed on one path down the tree to a rule; `placed` is the
    /// longest path found (entries in tree order), `left` the keys that found no level.
    NoPath {
        placed: Vec<Entry>,
        left: Vec<String>,
    },
}

impl Level {
    /// Orders an RLQS `BucketId` (an unordered map) into the descriptor it stands for: at each
    /// level, one not-yet-placed entry whose key a descriptor at that level names (and whose
    /// value it matches) is placed, entries tried in key order, backtracking when a choice cannot
    /// place the rest. Every entry must be placed and the last one must reach a rule, so a bucket
    /// id reaches a rule exactly when some ordering of its entries would as an RLS descriptor,
    /// and then the same rule (and so the same storage key). `entries` must have distinct keys,
    /// sorted. The search is bounded by the tree, not by the orders of the entries: entries have
    /// distinct keys, so each path of choices reaches a different node, and each node is visited
    /// at most once — at most (entries × nodes) lookups.
    pub fn place(&self, entries: &[Entry]) -> Result<(Vec<Entry>, Arc<Rule>), Unplaced> {
        let mut search = Search {
            used: vec![false; entries.len()],
            path: Vec::with_capacity(entries.len()),
            best: Vec::new(),
        };
        if let Some(rule) = self.place_from(entries, &mut search) {
            return Ok((search.path, rule));
        }
        let best = search.best;
        let left = entries
            .iter()
            .filter(|e| !best.iter().any(|b| b.key == e.key))
            .map(|e| e.key.clone())
            .collect();
        Err(Unplaced::NoPath { placed: best, left })
    }

    fn place_from(&self, entries: &[Entry], search: &mut Search) -> Option<Arc<Rule>> {
        for i in 0..entries.len() {
            if search.used[i] {
                continue;
            }
            let Some(node) = self.select(&entries[i]) else {
                continue;
            };
            search.used[i] = true;
            search.path.push(entries[i].clone());
            if search.path.len() > search.best.len() {
                search.best.clone_from(&search.path);
            }
            let found = if search.path.len() == entries.len() {
                node.rule.clone()
            } else {
                node.children.place_from(entries, search)
            };
            if found.is_some() {
                return found;
            }
            search.path.pop();
            search.used[i] = false;
        }
        None
    }
}

/// The state of one [`Level::place`] search.
struct Search {
    used: Vec<bool>,
    path: Vec<Entry>,
    best: Vec<Entry>,
}

#[cfg(test)]
mod tests {
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
}
